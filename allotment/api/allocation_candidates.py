"""``GET /allocation_candidates``: every way to satisfy a request, and the
providers involved.

The query is parsed by :mod:`allotment.domain.request_groups`, the
snapshot of candidate trees comes from :mod:`allotment.db.allocation_candidates`
and the solver in :mod:`allotment.domain.allocation_candidates` does the
rest; this module shapes the answer by microversion:

* 1.10: ``allocation_requests`` hold a *list* of
  ``{resource_provider: {uuid}, resources}``; from 1.12 a dict keyed by
  provider uuid;
* 1.15: ``Last-Modified`` (now: the answer is computed) and ``Cache-Control``;
* 1.17: provider summaries list traits;
* 1.27: summaries show every resource class of the provider, not only
  the requested ones;
* 1.29: summaries carry parent and root uuids, and list every provider of
  each tree used (the solver decides which);
* 1.34: each allocation request says which providers serve which group
  (``mappings``).

``[placement] max_allocation_candidates`` caps how many candidates are
generated.  When it is unset (-1) a safety cap of
:data:`SAFETY_CAP` applies instead, so that a combinatorially huge request
(e.g. four single-unit groups over a hundred identical devices of one
host: ~10^8 candidates) answers quickly with the first ones instead of
exhausting the worker's memory; hitting it is logged.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Sequence

import orjson
import webob

from allotment.api import answer_cache
from allotment.api.collector import gc_paused
from allotment.api.errors import HTTPError
from allotment.api.http import Request, encoded_json_response, json_response, query_params
from allotment.api.state import MAX_ENCODED, MAX_NAMES_AT
from allotment.db import allocation_candidates as db
from allotment.db import changes
from allotment.db import resource_providers as providers_db
from allotment.db.provider_mirror import MirrorAhead, Mirrored
from allotment.domain import allocation_candidates as solver
from allotment.domain.errors import BadRequest
from allotment.domain.inventories import ResourceClassNotFound
from allotment.domain.provider_tree import KeptResults, ProviderSnapshot
from allotment.domain.resource_providers import ProviderFilters
from allotment.domain.request_groups import (
    NESTED_AWARE_VERSION,
    AllocationCandidatesRequest,
    allocation_candidates_query_schema,
    parse_allocation_candidates,
)

LOG = logging.getLogger(__name__)

#: Most candidates generated for one request when ``[placement]
#: max_allocation_candidates`` is unset (-1).  Far above what a scheduler
#: asks for (nova sends ``limit=1000``) and above the plainest request of a
#: 10,000-host cloud, yet cheap: 20,000 candidates of five providers each
#: take about 0.3 s and 100 MB at most, where the ~10^8 that four VGPUs on a
#: 128-device host allow would exhaust the worker.  An operator who wants
#: more sets ``max_allocation_candidates`` to the number wanted.
SAFETY_CAP = 20_000

#: The query's JSON schema at a version, applied (to the last value of each
#: key) before the parser reads the query, as Placement does; the route
#: table names it.
QUERY = allocation_candidates_query_schema


def list_allocation_candidates(req: Request) -> webob.Response:
    """GET /allocation_candidates.

    An answer already computed for the same query and microversion is given
    again while the database's change number has not moved (see
    :mod:`allotment.api.answer_cache`); the number is read first, in the
    read transaction that would compute the answer afresh.
    """
    cache = req.app.state.answers
    conf = req.app.conf.placement
    if cache is None or conf.randomize_allocation_candidates:
        request = parse_query(req)
        with gc_paused():
            # The answer's objects are all freed (by reference counting) when
            # _answer returns, before the collector resumes: it then has no
            # backlog of young objects to walk.
            return json_response(req, _answer(req, request))
    key = (req.version, req.environ.get("QUERY_STRING", ""),
           conf.max_allocation_candidates, conf.allocation_candidates_generation_strategy)
    # The number alone first: a single statement, which is all a reused
    # answer needs (equal numbers: nothing it depends on was written since
    # it was computed).  The writes the mirror knows of are marked before.
    mirror = req.app.state.mirror
    known = mirror.mark() if mirror is not None else None
    number, compact_due = changes.current_number(req.app.db.engine)
    answer = cache.get(key, number)
    if answer is None:
        def computed(conn, mirrored: bool) -> tuple:
            read, due = number, compact_due
            if read is None or conn.dialect.name != "postgresql":
                # Read again, first in the transaction the answer is computed
                # in.  (PostgreSQL reads run without one, each statement in
                # a snapshot of its own: the number read just now is as good.)
                read, due = changes.read_number(conn)
            request = parse_query(req)
            with gc_paused():
                found = _found(req, conn, request, read if mirrored else None, known)
                return read, due, answer_cache.Answer(orjson.dumps(_shaped(req, request, found)),
                                                      len(found.allocation_requests), _capped(req, found))

        number, compact_due, answer = _in_read(req, computed)
        cache.put(key, number, answer)
    elif answer.capped:
        _log_capped(req)
    if compact_due:
        _compact(req)
    if req.app.metrics is not None:
        req.app.metrics.observe_candidates(answer.count)
    return encoded_json_response(req, answer.body)


def _compact(req: Request) -> None:
    """Fold the change log into its counter; the answer is ready whatever
    becomes of that (the next request tries again)."""
    try:
        with req.app.db.write() as conn:
            changes.compact(conn)
    except Exception:  # noqa: BLE001 - housekeeping must not fail the request
        LOG.warning("%s: folding the change log failed", req.request_id, exc_info=True)


#: Requests parsed, by (endpoint, microversion, query string): schedulers
#: ask the same few queries again and again, and parsing one was an eighth
#: of a computed ``limit=10`` answer's CPU (0.044 of 0.37 ms, SQLite, 2,000
#: trees).  Only valid queries are kept; the requests are immutable.
_PARSED: dict[tuple, AllocationCandidatesRequest] = {}
#: Queries kept at most (then all are forgotten).
PARSED_KEPT = 1024


def parse_query(req: Request) -> AllocationCandidatesRequest:
    """The request the query string makes, or Placement's 400 (``GET
    /allotment/explain`` reads its query with this too)."""
    key = (id(req.endpoint), req.version, req.environ.get("QUERY_STRING", ""))
    request = _PARSED.get(key)
    if request is None:
        # The schema's verdict first (an unknown or missing parameter), then
        # req.GET's 400 for a query that is not UTF-8 or holds a NUL, as Placement.
        query_params(req)
        request = parse_allocation_candidates(list(req.GET.items()), req.version)
        if len(_PARSED) >= PARSED_KEPT:
            _PARSED.clear()
        _PARSED[key] = request
    return request


def find(req: Request, conn, request: AllocationCandidatesRequest, *, lenient: bool = False,
         number: int | None = None, known: int | None = None) -> tuple[db.Names, solver.AllocationCandidates]:
    """The names of the request and its answer, read with ``conn`` (the
    same steps for an answer and for an explanation).  ``number``: the
    change number read first in ``conn``'s transaction, when the answer
    may come from the process's mirror of every provider; ``known``: the
    mirror's mark taken before it was read (see
    :meth:`~allotment.db.provider_mirror.ProviderMirror.mark`).

    An unknown resource class or trait is a 400.  With ``lenient`` (the
    answer, as Placement gives it), an unknown name in a group is not
    reported when Placement's search ends, with an empty answer, before it
    looks at that name (see :func:`_ends_before`).
    """
    mirror = req.app.state.mirror
    if mirror is None or number is None:
        names, mirrored = _names(req, conn, request, number), None
    else:
        names, mirrored = _mirrored_names(req, conn, request, number, known, mirror)
    problem = db.first_unknown(request, names.class_ids, names.trait_ids)
    if problem is not None:
        index, error = problem
        if not (lenient and index is not None and _ends_before(req, conn, request, names, index, error)):
            raise _reported(error)
        return names, _solve(req, request, db.Candidates(ProviderSnapshot(), ()))
    if mirrored is not None:
        candidates = db.mirrored_candidates(request, names, mirrored.snapshot)
        return names, _solve(req, request, candidates, mirrored.kept)
    candidates = db.load_candidates(conn, request, names, req.app.state.providers, wanted=_wanted(req, request))
    return names, _solve(req, request, candidates)


def _names(req: Request, conn, request: AllocationCandidatesRequest, number: int | None) -> db.Names:
    """The ids of the request's names (not checked), kept for the next
    requests while the change number read in ``conn``'s transaction stays
    ``number``: every table they come from is one the number follows."""
    if number is None:
        return db.resolve_names(conn, request, check=False)
    state = req.app.state
    kept_number, kept = state.names_at
    if kept_number != number or len(kept) >= MAX_NAMES_AT:
        kept = {}
        state.names_at = (number, kept)
    key = (tuple(request.resource_class_names()), frozenset(request.trait_names()),
           frozenset(request.aggregate_uuids()), frozenset(request.in_tree_uuids()))
    names = kept.get(key)
    if names is None:
        names = kept[key] = db.resolve_names(conn, request, check=False)
    return names


def _mirrored_names(req: Request, conn, request: AllocationCandidatesRequest, number: int, known: int | None,
                    mirror) -> tuple[db.Names, Mirrored | None]:
    """The request's names and the mirror of every provider brought to
    ``conn``'s number (None: this request reads the database).

    Names all known in the mirror's lineage (:class:`db.KnownNames`) cost
    no statement: on PostgreSQL, where a read after a write otherwise
    makes three round trips (the number, the names, the mirror's refresh),
    that is one fewer.  Otherwise they are read first, then the mirror is
    brought up to date, and the lineage learns them when no full read came
    between: names that existed at that read exist at every snapshot of
    the lineage from then on (only an update or a delete in a table of
    names removes one, and the database notes those as a change of
    everything, which starts a new lineage)."""
    names_known = mirror.known_names()
    seen = None if names_known is None else names_known.covering(request)
    if seen is not None:
        mirrored = mirror.snapshot(conn, number, known)
        if mirrored is not None and mirrored.names is names_known:
            return names_known.names(request, mirrored.snapshot, seen), mirrored
        # Every provider was read again since (or this request reads the
        # database): the names are read before the snapshot is taken again.
    names = _names(req, conn, request, number)
    mirrored = mirror.snapshot(conn, number, known)
    if mirrored is not None and mirrored.names is names_known:
        names_known.learn(names)
    return names, mirrored


def _reported(error: BadRequest) -> Exception:
    if isinstance(error, ResourceClassNotFound):
        return HTTPError(400, f"Invalid resource class in resources parameter: {error.message}")
    return error


def _ends_before(req: Request, conn, request: AllocationCandidatesRequest, names: db.Names,
                 index: int, error: BadRequest) -> bool:
    """Whether Placement's search ends with nothing before it looks up the
    unknown name (``error``) of group ``index``: no root meets
    ``root_required``, an earlier group finds nothing on its own, or (for a
    trait) the group's ``member_of`` aggregates have no member."""
    return (db.no_root_qualifies(conn, request, names)
            or any(_finds_nothing(req, conn, request, group) for group in request.groups[:index])
            or (isinstance(error, db.UnknownTraits) and db.no_member(conn, request.groups[index], names)))


def _finds_nothing(req: Request, conn, request: AllocationCandidatesRequest, group) -> bool:
    """Whether ``group`` (whose names all exist), searched alone with the
    request-wide filters, has no candidate at all.

    Before 1.29 Placement leaves out the candidates that use more than one
    provider of a tree only after every group was searched, so a group's
    own search sees the trees whole (its early end depends on that).
    """
    if not group.resources:
        # Placement looks a resourceless group's provider up by its required
        # traits and aggregates: none named, none found; else any provider
        # with them (and none forbidden) in its in_tree.
        return not solver.names_something(group) or not providers_db.list_providers(conn, ProviderFilters(
            in_tree=group.in_tree, traits=group.traits, aggregates=group.aggregates))
    alone = dataclasses.replace(request, groups=(group,), group_policy=None, same_subtrees=(), limit=1,
                                version=max(request.version, NESTED_AWARE_VERSION))
    names = db.resolve_names(conn, alone)
    candidates = db.load_candidates(conn, alone, names, req.app.state.providers, wanted=_wanted(req, alone))
    return not _solve(req, alone, candidates).allocation_requests


def generation_cap(conf) -> tuple[int, str]:
    """(the most candidates generated, what sets it): ``[placement]
    max_allocation_candidates``, or the safety cap when that is -1."""
    cap = conf.placement.max_allocation_candidates
    if cap < 0:
        return SAFETY_CAP, "safety cap"
    return cap, "max_allocation_candidates"


#: Read transactions begun again when the provider mirror was ahead of
#: the last (SQLite), before the database is read instead.
AHEAD_RETRIES = 3


def _in_read(req: Request, work):
    """``work(conn, mirrored)`` in a read transaction (one: the summaries show
    the usage the solver saw), begun again while the provider mirror is
    ahead of it (:class:`MirrorAhead`: another thread moved the mirror on
    since this transaction began, and one begun now is served from it);
    after :data:`AHEAD_RETRIES` tries, the last is told not to use the
    mirror (``mirrored`` false) and reads the database."""
    for _ in range(AHEAD_RETRIES):
        try:
            with req.app.db.read() as conn:
                return work(conn, True)
        except MirrorAhead:
            continue
    with req.app.db.read() as conn:
        return work(conn, False)


def _answer(req: Request, request: AllocationCandidatesRequest) -> dict:
    mirror = req.app.state.mirror

    def found_in(conn, mirrored: bool) -> tuple:
        # Read even without a mirror: it tells when the PostgreSQL log is due
        # to be folded, which nothing else would do without reused answers.
        known = mirror.mark() if mirror is not None else None
        number, compact_due = changes.read_number(conn)
        return compact_due, _found(req, conn, request, number if mirror is not None and mirrored else None, known)

    compact_due, found = _in_read(req, found_in)
    if compact_due:
        _compact(req)
    if req.app.metrics is not None:
        req.app.metrics.observe_candidates(len(found.allocation_requests))
    return _shaped(req, request, found)


def _found(req: Request, conn, request: AllocationCandidatesRequest,
           number: int | None, known: int | None = None) -> solver.AllocationCandidates:
    _, found = find(req, conn, request, lenient=True, number=number, known=known)
    return found


def _shaped(req: Request, request: AllocationCandidatesRequest, found: solver.AllocationCandidates) -> dict:
    if found.summary_trees is not None:
        summaries = _tree_summaries(req, request, found.summary_trees)
    else:
        summaries = _provider_summaries(req, request, found.provider_summaries)
    return {
        "allocation_requests": _allocation_requests(req, found),
        "provider_summaries": summaries,
    }


def _wanted(req: Request, request: AllocationCandidatesRequest) -> int | None:
    """How many candidates will be taken in anchor order, if that is known:
    then trees need loading only until that many are found."""
    conf = req.app.conf.placement
    if (request.limit is None or conf.randomize_allocation_candidates
            or conf.allocation_candidates_generation_strategy != solver.DEPTH_FIRST):
        return None
    return request.limit


def _solve(req: Request, request: AllocationCandidatesRequest, candidates: db.Candidates,
           kept: KeptResults | None = None) -> solver.AllocationCandidates:
    conf = req.app.conf.placement
    cap, _ = generation_cap(req.app.conf)
    safety = conf.max_allocation_candidates < 0
    found = solver.find_allocation_candidates(
        request, candidates.snapshot,
        max_candidates=cap,
        strategy=conf.allocation_candidates_generation_strategy,
        randomize=conf.randomize_allocation_candidates,
        anchors=candidates.anchors,
        kept=kept)
    if safety and found.generated >= SAFETY_CAP:
        _log_capped(req)
    return found


def _capped(req: Request, found: solver.AllocationCandidates) -> bool:
    return req.app.conf.placement.max_allocation_candidates < 0 and found.generated >= SAFETY_CAP


def _log_capped(req: Request) -> None:
    LOG.warning("%s: allocation candidates cut at the safety cap of %d (set [placement] "
                "max_allocation_candidates to choose the cap, or ask with a limit)",
                req.request_id, SAFETY_CAP)


def _allocation_requests(req: Request, found: solver.AllocationCandidates) -> list:
    """Each candidate in the form of the request's microversion, encoded.

    A candidate the solver keeps across requests (one of
    ``found.kept_runs``) has its encoded form kept in
    ``state.encoded_candidates`` for the last form asked: (the candidate,
    weakly, the form, the JSON), given again while the candidate lives and
    is asked for in that form."""
    form = 0 if req.version < (1, 12) else 1 if req.version < (1, 34) else 2
    candidates = found.allocation_requests
    if not found.kept_runs:  # all made for this request only
        return [_allocation_request(form, candidate) for candidate in candidates]
    encoded = req.app.state.encoded_candidates
    known_of = encoded.get
    kept: set[int] | None = None
    result: list = []
    for candidate in candidates:
        known = known_of(id(candidate))
        if known is None or known[1] != form or known[0]() is not candidate:
            if kept is None:
                kept = found.kept_ids()
            if id(candidate) not in kept:  # made for this request only
                result.append(_allocation_request(form, candidate))
                continue
            if len(encoded) >= MAX_ENCODED:
                encoded.clear()
            # An exact-size copy (orjson's own bytes keep the room its writer grew to).
            known = encoded[id(candidate)] = (weakref.ref(candidate), form, orjson.Fragment(memoryview(
                orjson.dumps(_allocation_request(form, candidate))).tobytes()))
        result.append(known[2])
    return result


def _allocation_request(form: int, candidate: solver.AllocationRequest) -> dict:
    if form == 0:
        return {"allocations": [{"resource_provider": {"uuid": uuid}, "resources": resources}
                                for uuid, resources in candidate.allocations.items()]}
    allocations = {uuid: {"resources": resources} for uuid, resources in candidate.allocations.items()}
    return {"allocations": allocations} if form == 1 else {"allocations": allocations,
                                                           "mappings": candidate.mappings}


def _provider_summaries(req: Request, request: AllocationCandidatesRequest,
                        summaries: Sequence[solver.ProviderSummary]) -> dict[str, orjson.Fragment]:
    """Each provider with its inventories' capacity and usage (before 1.27
    only the requested classes), traits (1.17) and place in its tree
    (1.29), encoded: encoded once per provider state and form (see
    ``state.encoded_summaries``)."""
    with_traits = req.version >= (1, 17)
    nested = req.version >= (1, 29)
    requested = None if req.version >= (1, 27) else frozenset(request.resource_class_names())
    encoded = req.app.state.encoded_summaries
    result = {}
    for summary in summaries:
        provider = summary.provider
        parent, root = summary.parent_provider_uuid, summary.root_provider_uuid
        key = (provider.id, with_traits, nested, requested)
        known = encoded.get(key)
        if known is None or known[0] is not provider or known[1] != parent or known[2] != root:
            if len(encoded) >= MAX_ENCODED:
                encoded.clear()
            known = encoded[key] = (provider, parent, root,
                                    _encoded_summary(summary, with_traits, nested, requested))
        result[provider.uuid] = known[3]
    return result


def _tree_summaries(req: Request, request: AllocationCandidatesRequest,
                    trees: Sequence[solver.TreeSummaries]) -> dict[str, orjson.Fragment]:
    """:func:`_provider_summaries` of whole trees the solver keeps across
    requests: each tree's encoded summaries are kept in
    ``state.encoded_trees`` for the last form asked (the tree, weakly, the
    form, {uuid: JSON}), given again while the tree lives and is asked for
    in that form."""
    form = (req.version >= (1, 17), req.version >= (1, 29),
            None if req.version >= (1, 27) else frozenset(request.resource_class_names()))
    encoded = req.app.state.encoded_trees
    known_of = encoded.get
    result: dict[str, orjson.Fragment] = {}
    for tree in trees:
        known = known_of(id(tree))
        if known is None or known[1] != form or known[0]() is not tree:
            if len(encoded) >= MAX_ENCODED:
                encoded.clear()
            known = encoded[id(tree)] = (weakref.ref(tree), form, _provider_summaries(req, request, tree.summaries))
        result.update(known[2])
    return result


def _encoded_summary(summary: solver.ProviderSummary, with_traits: bool, nested: bool,
                     requested: frozenset | None) -> orjson.Fragment:
    provider = summary.provider
    body: dict = {"resources": {
        rc: {"capacity": inv.capacity, "used": inv.used}
        for rc, inv in provider.inventories.items() if requested is None or rc in requested}}
    if with_traits:
        body["traits"] = provider.traits  # a tuple: orjson writes an array
    if nested:
        body["parent_provider_uuid"] = summary.parent_provider_uuid
        body["root_provider_uuid"] = summary.root_provider_uuid
    # A copy of orjson's bytes: they keep the 4 KiB its writer started
    # with (a 250-byte summary would cost 4 KiB kept).
    return orjson.Fragment(memoryview(orjson.dumps(body)).tobytes())
