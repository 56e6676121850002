"""Policy: the rules Placement registers, and how a request is checked.

Operators' policy files name Placement's rules, so every rule name, check
string, ``scope_types`` value and deprecated fallback below is the one the
reference implementation registers; only the descriptions are our own.

Layout of the defaults
----------------------
Five base rules carry the roles; every ``placement:*`` rule points at one
of three of them:

* ``admin_or_service_api`` (``role:admin or role:service``) for almost
  every operation,
* ``service_api`` (``role:service``) for ``POST /reshaper`` only,
* ``admin_or_project_reader_or_service_api`` for ``GET /usages``, where a
  reader may see the totals of their own project (the handler passes the
  queried ``project_id`` in the target).

The legacy default, ``role:admin``, is attached as a ``DeprecatedRule``
(named ``rule:admin_api``, as upstream) to the base rules, not to each
operation.  With ``[oslo_policy] enforce_new_defaults = False`` oslo.policy
ORs it into each of those base rules, so an ``admin`` in any project keeps
every permission it had; with ``True`` only the new check strings apply.

Scope: every operation rule has ``scope_types=['project']``.  oslo.policy 6
always enforces scope (its ``enforce_scope`` option no longer exists and a
value for it in ``placement.conf`` is ignored), so a system-scoped token is
refused every ``placement:*`` operation whatever its roles, under both the
legacy and the new defaults.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from oslo_config import cfg
from oslo_policy import opts as policy_opts
from oslo_policy import policy

from allotment.domain import errors

__all__ = [
    "DEFAULT_RULES",
    "PolicyContext",
    "authorize",
    "credentials",
    "make_enforcer",
]

# ---------------------------------------------------------------------------
# Rule names (handlers should use these constants rather than literals).
# ---------------------------------------------------------------------------

RULE_ADMIN_API = "rule:admin_api"
ADMIN_OR_SERVICE = "rule:admin_or_service_api"
SERVICE = "rule:service_api"
ADMIN_OR_PROJECT_READER_OR_SERVICE = "rule:admin_or_project_reader_or_service_api"

RP_LIST = "placement:resource_providers:list"
RP_CREATE = "placement:resource_providers:create"
RP_SHOW = "placement:resource_providers:show"
RP_UPDATE = "placement:resource_providers:update"
RP_DELETE = "placement:resource_providers:delete"

RC_LIST = "placement:resource_classes:list"
RC_CREATE = "placement:resource_classes:create"
RC_SHOW = "placement:resource_classes:show"
RC_UPDATE = "placement:resource_classes:update"
RC_DELETE = "placement:resource_classes:delete"

INVENTORY_LIST = "placement:resource_providers:inventories:list"
INVENTORY_CREATE = "placement:resource_providers:inventories:create"
INVENTORY_SHOW = "placement:resource_providers:inventories:show"
INVENTORY_UPDATE = "placement:resource_providers:inventories:update"
INVENTORY_DELETE = "placement:resource_providers:inventories:delete"

AGGREGATE_LIST = "placement:resource_providers:aggregates:list"
AGGREGATE_UPDATE = "placement:resource_providers:aggregates:update"

RP_USAGES = "placement:resource_providers:usages"
TOTAL_USAGES = "placement:usages"

TRAITS_LIST = "placement:traits:list"
TRAITS_SHOW = "placement:traits:show"
TRAITS_UPDATE = "placement:traits:update"
TRAITS_DELETE = "placement:traits:delete"
RP_TRAITS_LIST = "placement:resource_providers:traits:list"
RP_TRAITS_UPDATE = "placement:resource_providers:traits:update"
RP_TRAITS_DELETE = "placement:resource_providers:traits:delete"

ALLOC_MANAGE = "placement:allocations:manage"
ALLOC_LIST = "placement:allocations:list"
ALLOC_UPDATE = "placement:allocations:update"
ALLOC_DELETE = "placement:allocations:delete"
RP_ALLOC_LIST = "placement:resource_providers:allocations:list"

ALLOCATION_CANDIDATES_LIST = "placement:allocation_candidates:list"

RESHAPE = "placement:reshaper:reshape"

_PROJECT = ["project"]

# ---------------------------------------------------------------------------
# Base rules
# ---------------------------------------------------------------------------

_LEGACY_REASON = (
    "Placement's defaults now use the reader/member/admin/service roles and "
    "declare the token scope each operation expects. The single legacy "
    "'admin role for everything' default is deprecated and only applies "
    "while [oslo_policy] enforce_new_defaults is False."
)

# "W" is the Wallaby release, when upstream deprecated the legacy default
# (oslo_log.versionutils.deprecated.WALLABY).
_LEGACY_ADMIN = policy.DeprecatedRule(
    name=RULE_ADMIN_API,
    check_str="role:admin",
    deprecated_reason=_LEGACY_REASON,
    deprecated_since="W",
)

_BASE_RULES: list[policy.RuleDefault] = [
    policy.RuleDefault(
        "admin_api",
        "role:admin",
        description="Base rule for Placement operations reserved to administrators.",
        scope_types=list(_PROJECT),
    ),
    policy.RuleDefault(
        "service_api",
        "role:service",
        description="Base rule for operations meant for other OpenStack services.",
        scope_types=list(_PROJECT),
        deprecated_rule=_LEGACY_ADMIN,
    ),
    policy.RuleDefault(
        "admin_or_service_api",
        "role:admin or role:service",
        description="Base rule for most Placement operations: administrators "
                    "or OpenStack services.",
        scope_types=list(_PROJECT),
        deprecated_rule=_LEGACY_ADMIN,
    ),
    policy.RuleDefault(
        "project_reader_api",
        "role:reader and project_id:%(project_id)s",
        description="Base rule for read-only access by a reader of the "
                    "project the request concerns.",
        deprecated_rule=_LEGACY_ADMIN,
    ),
    policy.RuleDefault(
        "admin_or_project_reader_or_service_api",
        "role:admin or rule:project_reader_api or role:service",
        description="Base rule for project-level reads: administrators, "
                    "OpenStack services, or readers of the project concerned.",
        scope_types=list(_PROJECT),
        deprecated_rule=_LEGACY_ADMIN,
    ),
]


def _op(name: str, check: str, description: str,
        operations: Sequence[tuple[str, str]]) -> policy.DocumentedRuleDefault:
    return policy.DocumentedRuleDefault(
        name=name,
        check_str=check,
        description=description,
        operations=[{"method": m, "path": p} for m, p in operations],
        scope_types=list(_PROJECT),
    )


_RP = "/resource_providers"
_RP_ONE = "/resource_providers/{uuid}"
_INV = "/resource_providers/{uuid}/inventories"
_INV_ONE = "/resource_providers/{uuid}/inventories/{resource_class}"
_AGG = "/resource_providers/{uuid}/aggregates"
_RC = "/resource_classes"
_RC_ONE = "/resource_classes/{name}"
_TRAIT = "/traits/{name}"
_RP_TRAITS = "/resource_providers/{uuid}/traits"
_ALLOC = "/allocations/{consumer_uuid}"

_OPERATION_RULES: list[policy.DocumentedRuleDefault] = [
    # Resource providers.
    _op(RP_LIST, ADMIN_OR_SERVICE, "List or search resource providers.",
        [("GET", _RP)]),
    _op(RP_CREATE, ADMIN_OR_SERVICE, "Create a resource provider.",
        [("POST", _RP)]),
    _op(RP_SHOW, ADMIN_OR_SERVICE, "Show one resource provider.",
        [("GET", _RP_ONE)]),
    _op(RP_UPDATE, ADMIN_OR_SERVICE, "Update a resource provider (its name or parent).",
        [("PUT", _RP_ONE)]),
    _op(RP_DELETE, ADMIN_OR_SERVICE, "Delete a resource provider.",
        [("DELETE", _RP_ONE)]),
    # Resource classes.
    _op(RC_LIST, ADMIN_OR_SERVICE, "List the resource classes.",
        [("GET", _RC)]),
    _op(RC_CREATE, ADMIN_OR_SERVICE, "Create a custom resource class.",
        [("POST", _RC)]),
    _op(RC_SHOW, ADMIN_OR_SERVICE, "Show one resource class.",
        [("GET", _RC_ONE)]),
    _op(RC_UPDATE, ADMIN_OR_SERVICE,
        "Update a custom resource class (from microversion 1.7: create it).",
        [("PUT", _RC_ONE)]),
    _op(RC_DELETE, ADMIN_OR_SERVICE, "Delete a custom resource class.",
        [("DELETE", _RC_ONE)]),
    # Inventories.
    _op(INVENTORY_LIST, ADMIN_OR_SERVICE,
        "List every inventory record of a resource provider.",
        [("GET", _INV)]),
    _op(INVENTORY_CREATE, ADMIN_OR_SERVICE,
        "Add one inventory record to a resource provider.",
        [("POST", _INV)]),
    _op(INVENTORY_SHOW, ADMIN_OR_SERVICE,
        "Show one inventory record of a resource provider.",
        [("GET", _INV_ONE)]),
    _op(INVENTORY_UPDATE, ADMIN_OR_SERVICE,
        "Replace all, or change one, of a resource provider's inventory records.",
        [("PUT", _INV), ("PUT", _INV_ONE)]),
    _op(INVENTORY_DELETE, ADMIN_OR_SERVICE,
        "Remove all, or one, of a resource provider's inventory records.",
        [("DELETE", _INV), ("DELETE", _INV_ONE)]),
    # Aggregates.
    _op(AGGREGATE_LIST, ADMIN_OR_SERVICE,
        "List the aggregates a resource provider belongs to.",
        [("GET", _AGG)]),
    _op(AGGREGATE_UPDATE, ADMIN_OR_SERVICE,
        "Set the aggregates a resource provider belongs to.",
        [("PUT", _AGG)]),
    # Usages.
    _op(RP_USAGES, ADMIN_OR_SERVICE,
        "Show how much of each resource class is consumed on a resource provider.",
        [("GET", "/resource_providers/{uuid}/usages")]),
    _op(TOTAL_USAGES, ADMIN_OR_PROJECT_READER_OR_SERVICE,
        "Show a project's (optionally a user's) total resource consumption. "
        "Readers may see their own project; administrators and services any.",
        [("GET", "/usages")]),
    # Traits.
    _op(TRAITS_LIST, ADMIN_OR_SERVICE, "List the traits.",
        [("GET", "/traits")]),
    _op(TRAITS_SHOW, ADMIN_OR_SERVICE, "Show one trait (whether it exists).",
        [("GET", _TRAIT)]),
    _op(TRAITS_UPDATE, ADMIN_OR_SERVICE, "Create or update a custom trait.",
        [("PUT", _TRAIT)]),
    _op(TRAITS_DELETE, ADMIN_OR_SERVICE, "Delete a custom trait.",
        [("DELETE", _TRAIT)]),
    _op(RP_TRAITS_LIST, ADMIN_OR_SERVICE,
        "List the traits of a resource provider.",
        [("GET", _RP_TRAITS)]),
    _op(RP_TRAITS_UPDATE, ADMIN_OR_SERVICE,
        "Set the traits of a resource provider.",
        [("PUT", _RP_TRAITS)]),
    _op(RP_TRAITS_DELETE, ADMIN_OR_SERVICE,
        "Remove every trait from a resource provider.",
        [("DELETE", _RP_TRAITS)]),
    # Allocations.
    _op(ALLOC_MANAGE, ADMIN_OR_SERVICE,
        "Write the allocations of several consumers at once.",
        [("POST", "/allocations")]),
    _op(ALLOC_LIST, ADMIN_OR_SERVICE, "Show the allocations of a consumer.",
        [("GET", _ALLOC)]),
    _op(ALLOC_UPDATE, ADMIN_OR_SERVICE, "Replace the allocations of a consumer.",
        [("PUT", _ALLOC)]),
    _op(ALLOC_DELETE, ADMIN_OR_SERVICE, "Remove the allocations of a consumer.",
        [("DELETE", _ALLOC)]),
    _op(RP_ALLOC_LIST, ADMIN_OR_SERVICE,
        "Show the allocations made against a resource provider.",
        [("GET", "/resource_providers/{uuid}/allocations")]),
    # Allocation candidates.
    _op(ALLOCATION_CANDIDATES_LIST, ADMIN_OR_SERVICE,
        "List allocation candidates: sets of providers able to satisfy a request.",
        [("GET", "/allocation_candidates")]),
    # Reshaper.
    _op(RESHAPE, SERVICE,
        "Move inventories and allocations between providers in one atomic "
        "operation.",
        [("POST", "/reshaper")]),
]

#: Every rule Placement registers, in the order upstream registers them.
DEFAULT_RULES: list[policy.RuleDefault] = _BASE_RULES + _OPERATION_RULES

# ---------------------------------------------------------------------------
# Allotment's own rules, for its routes outside Placement's URL space
# ---------------------------------------------------------------------------

EXPLAIN = "allotment:explain"
METRICS = "allotment:metrics"
CAPACITY = "allotment:capacity"

#: Registered beside Placement's; a policy file overrides them the same way.
ALLOTMENT_RULES: list[policy.RuleDefault] = [
    _op(EXPLAIN, RULE_ADMIN_API,
        "Explain what GET /allocation_candidates finds for a query string, filter by filter.",
        [("GET", "/allotment/explain")]),
    _op(METRICS, RULE_ADMIN_API,
        "Read the Prometheus metrics (when [allotment] metrics is on and metrics_public is off).",
        [("GET", "/metrics")]),
    _op(CAPACITY, RULE_ADMIN_API,
        "Read the capacity view's sums, trees, providers and projects (when [allotment] ui is on).",
        [("GET", "/allotment/capacity"), ("GET", "/allotment/capacity/trees"),
         ("GET", "/allotment/capacity/providers"), ("GET", "/allotment/capacity/providers/{uuid}"),
         ("GET", "/allotment/capacity/projects")]),
]


# ---------------------------------------------------------------------------
# Enforcer
# ---------------------------------------------------------------------------


#: How long a process goes on using the rules it loaded before looking at
#: the policy file again (oslo.policy on its own stats it on every check).
RELOAD_INTERVAL = 1.0
#: Most decisions remembered; the memory is emptied when it is full.
MAX_DECISIONS = 10_000


#: Types of values that are part of a key as they are (subclasses are too,
#: found by the slower isinstance).
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _frozen(mapping: Mapping[str, Any]) -> tuple | None:
    """A hashable, order-independent copy of a flat credentials or target
    mapping; None when some value cannot be part of a key."""
    items = []
    for key, value in mapping.items():
        kind = type(value)
        if kind is list or (kind not in _SCALARS and isinstance(value, list)):
            value = tuple(value)
        elif kind not in _SCALARS and not isinstance(value, (str, int, float, bool, type(None))):
            return None
        items.append((key, value))
    items.sort()
    return tuple(items)


class _Enforcer(policy.Enforcer):
    """oslo.policy's Enforcer, with remembered decisions.

    A decision depends only on the rules, the rule name, the target and
    the credentials, so it is remembered for those (a handful of distinct
    callers and rules make up almost every request).  oslo.policy on its
    own re-reads the configuration and stats the policy file on every
    check, which costs more than the rest of a simple request's handling;
    here the file is looked at once every :data:`RELOAD_INTERVAL` seconds
    at most, and the remembered decisions are dropped whenever the rules
    change (a reloaded file, ``set_rules``, new defaults).

    It also works on a ConfigOpts that was never parsed: oslo.policy
    resolves ``policy_file`` and ``policy_dirs`` through
    ``ConfigOpts.find_file`` (relative to the config file's directory),
    which raises ``NotInitializedError`` on a ConfigOpts that was built
    programmatically (tests, embedding).  Then only an absolute, existing
    path is used; anything else counts as "no policy file".
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self._decisions: dict[tuple, Any] = {}
        self._decided_with: Any = None
        self._rules_checked_at = float("-inf")
        self._decisions_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _forget_decisions(self) -> None:
        self._decisions = {}
        self._rules_checked_at = float("-inf")

    def set_rules(self, *args: Any, **kwargs: Any) -> None:
        super().set_rules(*args, **kwargs)
        self._forget_decisions()

    def register_default(self, *args: Any, **kwargs: Any) -> None:
        super().register_default(*args, **kwargs)
        self._forget_decisions()

    def clear(self) -> None:
        super().clear()
        self._forget_decisions()

    def _current_decisions(self) -> dict[tuple, Any]:
        """The remembered decisions, valid for the rules in force now."""
        now = time.monotonic()
        if now - self._rules_checked_at >= RELOAD_INTERVAL:
            with self._decisions_lock:
                if now - self._rules_checked_at >= RELOAD_INTERVAL:
                    self.load_rules()
                    if self.rules is not self._decided_with:
                        self._decisions = {}
                        # Held, so that its id cannot be reused by the next.
                        self._decided_with = self.rules
                    self._rules_checked_at = now
        return self._decisions

    def enforce(self, rule: Any, target: Any, creds: Any, do_raise: bool = False,
                exc: Any = None, *args: Any, **kwargs: Any) -> Any:
        if do_raise or not isinstance(rule, str) or not isinstance(creds, dict) \
                or not isinstance(target, Mapping):
            return super().enforce(rule, target, creds, do_raise, exc, *args, **kwargs)
        frozen_target, frozen_creds = _frozen(target), _frozen(creds)
        if frozen_target is None or frozen_creds is None:
            return super().enforce(rule, target, creds, do_raise, exc, *args, **kwargs)
        decisions = self._current_decisions()
        key = (rule, frozen_target, frozen_creds)
        try:
            return decisions[key]
        except KeyError:
            pass
        decision = super().enforce(rule, target, creds, do_raise, exc, *args, **kwargs)
        if len(decisions) >= MAX_DECISIONS:
            decisions.clear()
        decisions[key] = decision
        return decision

    def _get_policy_path(self, path: str) -> str:
        try:
            return super()._get_policy_path(path)
        except cfg.NotInitializedError:
            if os.path.isabs(path) and os.path.exists(path):
                return path
            raise cfg.ConfigFilesNotFoundError([path]) from None


def make_enforcer(conf: cfg.ConfigOpts) -> policy.Enforcer:
    """Build the Enforcer for ``conf`` with Placement's defaults registered.

    Reads ``[oslo_policy]`` from ``conf`` (the options are registered here
    if they are not already): ``policy_file`` (absolute, or relative to the
    config file's directory; a missing file just means "defaults only"),
    ``policy_dirs`` and ``enforce_new_defaults``.  Scope is always enforced
    (oslo.policy 6 has no ``enforce_scope`` switch).  The policy file is
    re-read when its mtime changes, noticed within :data:`RELOAD_INTERVAL`
    seconds.  A malformed policy file raises here, at start-up.
    """
    enforcer = _Enforcer(conf)
    # Overridden-default warnings would be logged once per deprecated rule
    # on every start with enforce_new_defaults=False; upstream mutes them too.
    enforcer.suppress_default_change_warnings = True
    enforcer.register_defaults(DEFAULT_RULES)
    enforcer.register_defaults(ALLOTMENT_RULES)
    enforcer.load_rules()
    return enforcer


# ---------------------------------------------------------------------------
# Authorisation
# ---------------------------------------------------------------------------


class PolicyContext(Protocol):
    """What :func:`authorize` reads from the request context.

    Required attributes:

    * ``user_id``, ``project_id``: ``str | None`` (no project when the
      token is system scoped),
    * ``roles``: ``list[str]`` (role names; compared case-insensitively),
    * ``system_scope``: ``None`` or ``'all'``,
    * ``is_admin``: ``bool``.  Not used for policy decisions (as in
      oslo.context, it is not part of the credentials): the ``admin`` role
      is what rules look at.

    Optional, read with ``getattr`` and defaulting to ``None``:
    ``domain_id`` (a domain-scoped token), ``user_domain_id``,
    ``project_domain_id``, ``service_user_id``, ``service_user_domain_id``,
    ``service_project_id``, ``service_project_domain_id``, ``service_roles``
    (defaults to ``[]``), ``is_admin_project`` (defaults to ``True``).
    """

    user_id: str | None
    project_id: str | None
    roles: Sequence[str]
    system_scope: str | None
    is_admin: bool


_OPTIONAL_CREDENTIALS = (
    "user_domain_id",
    "domain_id",
    "project_domain_id",
    "service_user_id",
    "service_user_domain_id",
    "service_project_id",
    "service_project_domain_id",
)


def credentials(context: PolicyContext) -> dict[str, Any]:
    """The oslo.policy credentials for ``context``.

    Same keys as ``oslo_context.RequestContext.to_policy_values()``, so
    custom check strings in operators' policy files (``user_id:...``,
    ``domain_id:...``, ``is_admin_project:True``) behave as upstream.
    """
    creds: dict[str, Any] = {
        "user_id": context.user_id,
        "project_id": context.project_id,
        "roles": list(context.roles or ()),
        "system_scope": context.system_scope,
        "is_admin_project": getattr(context, "is_admin_project", True),
        "service_roles": list(getattr(context, "service_roles", None) or ()),
    }
    for key in _OPTIONAL_CREDENTIALS:
        creds[key] = getattr(context, key, None)
    return creds


def authorize(enforcer: policy.Enforcer, context: PolicyContext, rule: str,
              target: Mapping[str, Any] | None = None) -> None:
    """Raise ``errors.Forbidden`` unless ``rule`` allows ``context`` on ``target``.

    ``target`` defaults to ``{"project_id": context.project_id,
    "user_id": context.user_id}``; ``GET /usages`` must pass the queried
    ``project_id`` instead.  A token whose scope is not among the rule's
    ``scope_types`` is refused the same way (403).  An unregistered ``rule``
    is a programming error and raises ``oslo_policy.policy.PolicyNotRegistered``.
    """
    if target is None:
        target = {"project_id": context.project_id, "user_id": context.user_id}
    allowed = enforcer.authorize(rule, dict(target), credentials(context),
                                 do_raise=False)
    if not allowed:
        raise errors.Forbidden(f"Policy does not allow {rule} to be performed.")


# ---------------------------------------------------------------------------
# oslo.policy's command-line tools
# ---------------------------------------------------------------------------


def list_rules() -> list[policy.RuleDefault]:
    """Placement's rules (``oslo.policy.policies`` entry point ``placement``):
    what ``oslopolicy-sample-generator --namespace placement`` writes out."""
    return list(DEFAULT_RULES)


def list_allotment_rules() -> list[policy.RuleDefault]:
    """Allotment's own rules (``--namespace allotment``)."""
    return list(ALLOTMENT_RULES)


def get_enforcer() -> policy.Enforcer:
    """An Enforcer with Placement's rules, for ``oslopolicy-checker`` and
    ``oslopolicy-policy-upgrade`` (``oslo.policy.enforcer`` entry point).

    The tools pass their own options on the command line, so this parses
    none; ``[oslo_policy]`` comes from ``placement.conf`` when there is one
    where Placement looks.
    """
    conf = cfg.ConfigOpts()

    policy_opts._register(conf)
    conf([], project="placement")
    enforcer = policy.Enforcer(conf)
    enforcer.register_defaults(DEFAULT_RULES)
    return enforcer
