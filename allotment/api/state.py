"""Everything one API process keeps between requests, in one owner.

The application (:class:`allotment.api.app.Application`, which the WSGI
server and the direct interface both build) makes one
:class:`ProcessState` and every handler reaches it as ``req.app.state``.
Every cache here depends on rows of the database and is dropped by one
rule: the database's change number (:mod:`allotment.db.changes`) or a
provider's generation (:mod:`allotment.db.generations`) moved, or the
database went back in time or was replaced (the number says so; where
there is none, a lost connection is taken to mean it).

======================  ===========================  =====================  ==================================
attribute               keyed on                     bound                  dropped when
======================  ===========================  =====================  ==================================
``answers``             version, query string, cap,  candidates_cache_mb    the change number moves (all at
                        strategy                                            once)
``names_at``            the names a query asks for   :data:`MAX_NAMES_AT`   the change number moves
``mirror``              every provider, and the      ``MAX_PROVIDERS``;     the providers noted since its
                        solver's results kept from   the tree memo's        number are replaced, with what was
                        them (candidates per tree    units; names:          computed from their trees; all at
                        and query, summaries), the   ``KnownNames.LIMIT``   a change of names or going back
                        names seen to exist
``providers``           provider id, uuid,           200,000 providers      the generation moves (per entry);
                        generation                   each                   all at going back, a lost link
``encoded_summaries``   provider id, form            :data:`MAX_ENCODED`    a new Provider object stands for
                                                                            the provider (its state moved)
``encoded_candidates``  the kept candidate, form     :data:`MAX_ENCODED`    the candidate is dropped from the
                                                                            mirror's results (weak reference)
``encoded_trees``       the kept tree summaries,     :data:`MAX_ENCODED`    the tree is dropped from the
                        form                                                mirror's results (weak reference)
======================  ===========================  =====================  ==================================

Besides the caches, one thing learnt from the writes themselves:
``swap_contention`` (:class:`allotment.db.allocations.SwapContention`),
whether this process's writes lately lost provider swaps to other writers,
and so lock their providers at their first read for a while.  And with
``[allotment] claims_together`` on PostgreSQL, the claims waiting at once:
``claim_groups`` (:class:`allotment.api.claim_groups.ClaimGroups`), which
writes them together.

The module globals left elsewhere are constant tables, statements,
schemas and memos of pure functions of such constants; docs/architecture.md
("State and its owner") lists them, and the two time-bound results kept by
the application's health check and metrics.
"""

from __future__ import annotations

from oslo_config import cfg

from allotment.api.answer_cache import AnswerCache
from allotment.api.claim_groups import ClaimGroups
from allotment.db import changes
from allotment.db.allocations import SwapContention
from allotment.db.engine import Database
from allotment.db.provider_cache import ProviderCaches
from allotment.db.provider_mirror import ProviderMirror

#: Names kept at most for one change number.
MAX_NAMES_AT = 1024
#: Encoded provider summaries kept at most (emptied when full).
MAX_ENCODED = 200_000


class ProcessState:
    """The caches of one process (see the module doc for each one's key,
    bound and the rule that drops it)."""

    def __init__(self, conf: cfg.ConfigOpts, database: Database):
        #: What the candidate loader keeps by provider generation.
        self.providers = ProviderCaches()
        # Where nothing notices a database gone back in time (MySQL/MariaDB
        # have no change number), a lost connection -- the server restarted
        # or failed over -- empties what is kept by provider generation.
        database.on_connection_lost.append(self.providers.forget)
        #: Answers of GET /allocation_candidates kept while nothing changed.
        self.answers: AnswerCache | None = None
        if conf.allotment.candidates_cache_mb > 0 and database.backend in changes.BACKENDS:
            self.answers = AnswerCache(conf.allotment.candidates_cache_mb * 1024 * 1024)
        #: (change number, {names asked: Names}): the ids of the names of
        #: recent candidate requests, read at that number.
        self.names_at: tuple = (None, {})
        #: Every provider, kept current (GET /allocation_candidates).
        self.mirror: ProviderMirror | None = None
        if conf.allotment.provider_mirror and database.backend in changes.NOTING_BACKENDS:
            self.mirror = ProviderMirror(self.providers)
        #: Encoded summaries: (provider id, traits shown, tree shown, classes
        #: shown) -> (the Provider, its parent and root uuids, the JSON).
        #: The database layer gives the same Provider object again while
        #: nothing it shows changed, so a summary is encoded once per
        #: provider state rather than at every request.
        self.encoded_summaries: dict[tuple, tuple] = {}
        #: Encoded candidates the mirror's kept results hold: id of the
        #: candidate -> (a weak reference to it, the form, the JSON).
        self.encoded_candidates: dict[int, tuple] = {}
        #: Encoded summaries of the trees the mirror's kept results hold: id
        #: of the TreeSummaries -> (a weak reference to it, the form, {uuid:
        #: JSON}).
        self.encoded_trees: dict[int, tuple] = {}
        #: Whether writes lately lost provider swaps (and so lock at their
        #: first read for a while).
        self.swap_contention = SwapContention()
        #: Claims waiting at once committed together (``claims_together``,
        #: PostgreSQL), else None.
        self.claim_groups: ClaimGroups | None = None
        if conf.allotment.claims_together and database.backend == "postgresql":
            self.claim_groups = ClaimGroups()
