"""The query language of ``GET /allocation_candidates`` (and the filters of
``GET /resource_providers`` that share its grammar).

Pure functions from already-decoded query pairs and a microversion tuple to
immutable request objects.  Clients and the upstream functional suite match
on the error texts, so every ``BadRequest`` here carries Placement's
message verbatim, and errors are raised in the order Placement finds them:

1. the JSON schema of the query (unknown keys, keys before their
   microversion, ``limit`` and ``group_policy`` values);
2. request-wide parameters: ``limit``, ``group_policy``, ``root_required``,
   ``same_subtree``;
3. each group key in query-string order (``resources*``, ``required*``,
   ``member_of*``, ``in_tree*`` values);
4. cross-checks: resourceless and orphaned groups, ``same_subtree``
   references, required/forbidden conflicts, ``group_policy`` presence.

Only syntax is checked here.  Whether a trait, resource class, aggregate or
provider exists is the caller's question (against the database); the
request objects list the names to check (:meth:`AllocationCandidatesRequest
.trait_names`, :meth:`~AllocationCandidatesRequest.resource_class_names`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import uuid as uuidlib
from collections.abc import Collection, Iterable, Mapping, Sequence

from allotment.domain import errors
from allotment.domain.inventory_fit import MAX_INT

Version = tuple[int, int]

# Microversions at which the query language grew.
LIMIT_VERSION = (1, 16)
REQUIRED_VERSION = (1, 17)
MEMBER_OF_VERSION = (1, 21)
FORBIDDEN_TRAITS_VERSION = (1, 22)
MULTI_MEMBER_OF_VERSION = (1, 24)
GRANULAR_VERSION = (1, 25)
NESTED_AWARE_VERSION = (1, 29)
IN_TREE_VERSION = (1, 31)
FORBIDDEN_AGGS_VERSION = (1, 32)
STRING_SUFFIX_VERSION = (1, 33)
MAPPINGS_VERSION = (1, 34)
ROOT_REQUIRED_VERSION = (1, 35)
SAME_SUBTREE_VERSION = (1, 36)
ANY_TRAITS_VERSION = (1, 39)

#: Group suffixes: numbers before 1.33, short words from 1.33.
NUMBERED_SUFFIX = r"[1-9][0-9]*"
STRING_SUFFIX = r"[a-zA-Z0-9_-]{1,64}"

GROUP_POLICIES = ("none", "isolate")

_GROUP_PREFIXES = ("resources", "required", "member_of", "in_tree")


# ---------------------------------------------------------------------------
# Request objects
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TraitExpression:
    """``required`` traits as an AND of any-of sets, plus forbidden traits.

    ``required=A,B&required=in:C,D`` becomes ``({A}, {B}, {C, D})``: a
    provider set satisfies it when its traits meet every set.
    """

    required: tuple[frozenset[str], ...] = ()
    forbidden: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.required or self.forbidden)

    def names(self) -> set[str]:
        """Every trait named, required or forbidden (for existence checks)."""
        found = set(self.forbidden)
        for any_of in self.required:
            found |= any_of
        return found

    def unknown(self, known: Collection[str]) -> set[str]:
        """The names to report as unknown: the required ones that are not
        ``known``, or if all are, the forbidden ones.

        Placement looks the required names up before the forbidden ones and
        names one unknown trait of the first kind it finds, in set order
        (random from one process to the next); all of that kind are named here.
        """
        missing = set().union(*self.required) - set(known)
        return missing or set(self.forbidden) - set(known)

    def satisfied_by(self, traits: Collection[str]) -> bool:
        """Do these traits meet every required set (forbidden not checked)?"""
        return all(not any_of.isdisjoint(traits) for any_of in self.required)

    def forbids_any(self, traits: Collection[str]) -> bool:
        return not self.forbidden.isdisjoint(traits)

    def matches(self, traits: Collection[str]) -> bool:
        """Required satisfied and nothing forbidden present."""
        return self.satisfied_by(traits) and not self.forbids_any(traits)


@dataclasses.dataclass(frozen=True)
class AggregateExpression:
    """``member_of`` as an AND of any-of aggregate sets, plus forbidden
    aggregates (``!uuid`` / ``!in:a,b``)."""

    required: tuple[frozenset[str], ...] = ()
    forbidden: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.required or self.forbidden)

    def satisfied_by(self, aggregates: Collection[str]) -> bool:
        return all(not any_of.isdisjoint(aggregates)
                   for any_of in self.required)

    def forbids_any(self, aggregates: Collection[str]) -> bool:
        return not self.forbidden.isdisjoint(aggregates)

    def matches(self, aggregates: Collection[str]) -> bool:
        return (self.satisfied_by(aggregates)
                and not self.forbids_any(aggregates))

    def uuids(self) -> set[str]:
        found = set(self.forbidden)
        for any_of in self.required:
            found |= any_of
        return found


@dataclasses.dataclass(frozen=True)
class RequestGroup:
    """One request group.  ``suffix`` is ``''`` for the unsuffixed group,
    whose resources may come from several providers of one tree plus
    sharing providers; a suffixed group must be met by one provider."""

    suffix: str = ""
    resources: Mapping[str, int] = dataclasses.field(default_factory=dict)
    traits: TraitExpression = TraitExpression()
    aggregates: AggregateExpression = AggregateExpression()
    in_tree: str | None = None

    @property
    def use_same_provider(self) -> bool:
        return bool(self.suffix)

    @property
    def is_resourceless(self) -> bool:
        return not self.resources


@dataclasses.dataclass(frozen=True)
class AllocationCandidatesRequest:
    """Everything ``GET /allocation_candidates`` asked for.

    ``groups`` keep the order their first key appeared in the query string.
    ``root_traits`` is ``root_required`` (required sets are single traits).
    """

    groups: tuple[RequestGroup, ...]
    limit: int | None = None
    group_policy: str | None = None
    root_traits: TraitExpression = TraitExpression()
    same_subtrees: tuple[frozenset[str], ...] = ()
    version: Version = (1, 39)

    @property
    def nested_aware(self) -> bool:
        """Before 1.29 one candidate may use only one provider per tree."""
        return self.version >= NESTED_AWARE_VERSION

    @property
    def isolate(self) -> bool:
        return self.group_policy == "isolate"

    def group(self, suffix: str) -> RequestGroup | None:
        for grp in self.groups:
            if grp.suffix == suffix:
                return grp
        return None

    def resource_class_names(self) -> list[str]:
        """Requested classes, each once, in query order (check existence:
        ``Invalid resource class in resources parameter: ...``)."""
        seen: dict[str, None] = {}
        for grp in self.groups:
            for rc in grp.resources:
                seen[rc] = None
        return list(seen)

    def trait_names(self) -> set[str]:
        """Every trait named anywhere (check existence: ``No such
        trait(s): ...``)."""
        found = self.root_traits.names()
        for grp in self.groups:
            found |= grp.traits.names()
        return found

    def aggregate_uuids(self) -> set[str]:
        found: set[str] = set()
        for grp in self.groups:
            found |= grp.aggregates.uuids()
        return found

    def in_tree_uuids(self) -> set[str]:
        return {grp.in_tree for grp in self.groups if grp.in_tree}


# ---------------------------------------------------------------------------
# Value parsers (shared with GET /resource_providers)
# ---------------------------------------------------------------------------

def _bad(message: str, code: str | None = None) -> errors.BadRequest:
    return errors.BadRequest(message, code=code)


def is_uuid_like(value: str) -> bool:
    """Accept what Placement accepts as a UUID: any spelling that the
    ``uuid`` module parses *and* that only differs from the canonical form
    by case, hyphens, braces or a ``urn:``/``uuid:`` prefix."""
    if not isinstance(value, str):
        return False
    try:
        canonical = uuidlib.UUID(value).hex
    except (TypeError, ValueError, AttributeError):
        return False
    loose = (value.replace("urn:", "").replace("uuid:", "").strip("{}")
             .replace("-", "").lower())
    return canonical == loose


_RESOURCES_FORM = ("Badly formed resources parameter. Expected resources "
                   "query string parameter in form: "
                   "?resources=VCPU:2,MEMORY_MB:1024. Got: %s.")


def parse_resources(value: str) -> dict[str, int]:
    """``VCPU:2,MEMORY_MB:1024`` -> ``{'VCPU': 2, 'MEMORY_MB': 1024}``.

    Class names are not checked here (existence is the caller's job); a
    class named twice keeps its last amount.
    """
    if value.strip() == "":
        raise _bad(_RESOURCES_FORM % "empty string")
    result: dict[str, int] = {}
    for item in value.split(","):
        parts = item.split(":")
        if len(parts) != 2:
            raise _bad(_RESOURCES_FORM % item)
        rc_name, raw_amount = parts
        try:
            amount = int(raw_amount)
        except ValueError:
            raise _bad(
                "Requested resource %s expected positive integer amount. "
                "Got: %s." % (rc_name, raw_amount)) from None
        if amount < 1:
            raise _bad("Requested resource %s requires amount >= 1. "
                       "Got: %d." % (rc_name, amount))
        if amount > MAX_INT:
            # No inventory could hold it (max_unit is at most MAX_INT), and
            # no database column could even compare it on every backend.
            raise _bad("Requested resource %s requires amount <= %d. "
                       "Got: %d." % (rc_name, MAX_INT, amount))
        result[rc_name] = amount
    return result


_ANY_TRAITS_FORM = "in:HW_CPU_X86_VMX,CUSTOM_MAGIC"


def parse_trait_value(value: str, *, allow_forbidden: bool,
                      allow_any: bool) -> TraitExpression:
    """One ``required`` value: ``A,!B`` (all of / none of) or ``in:A,B``
    (any of; 1.39+)."""
    if value.startswith("in:"):
        if not allow_any:
            raise _bad(
                "Invalid query string parameters: The format '%s' only "
                "supported since microversion 1.39. Got: %s"
                % (_ANY_TRAITS_FORM, value))
        any_of = frozenset(part.strip() for part in value[3:].split(","))
        if not all(any_of):
            raise _bad(
                "Invalid query string parameters: Expected 'required' "
                "parameter value of the form: %s. Got an empty trait in: %s"
                % (_ANY_TRAITS_FORM, value))
        if any(name.startswith("!") for name in any_of):
            raise _bad(
                "Invalid query string parameters: The format '%s' does not "
                "support forbidden traits. Got: %s" % (_ANY_TRAITS_FORM, value))
        return TraitExpression(required=(any_of,))

    names = [part.strip() for part in value.split(",")]
    # A leading run of '!' is stripped whole ('!!A' forbids A), as Placement
    # does.
    forbidden = frozenset(name.lstrip("!") for name in names
                          if name.startswith("!"))
    if not all(names) or not all(forbidden):
        expected = ("HW_CPU_X86_VMX,!CUSTOM_MAGIC" if allow_forbidden
                    else "HW_CPU_X86_VMX,CUSTOM_MAGIC")
        raise _bad(
            "Invalid query string parameters: Expected 'required' parameter "
            "value of the form: %s. Got an empty trait in: %s"
            % (expected, value))
    if forbidden and not allow_forbidden:
        raise _bad(
            "Invalid query string parameters: Expected 'required' parameter "
            "value of the form: HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: %s" % value)
    required = tuple(frozenset((name,)) for name in names
                     if not name.startswith("!"))
    return TraitExpression(required=required, forbidden=forbidden)


def parse_required(values: Sequence[str], version: Version) -> TraitExpression:
    """All ``required``/``requiredN`` values of one group.

    From 1.39 repeated parameters are ANDed and ``in:`` is allowed; before,
    only the last one counts.  Forbidden ``!TRAIT`` needs 1.22.
    """
    allow_forbidden = version >= FORBIDDEN_TRAITS_VERSION
    allow_any = version >= ANY_TRAITS_VERSION
    if not allow_any:
        values = list(values)[-1:]
    required: list[frozenset[str]] = []
    forbidden: set[str] = set()
    for value in values:
        expr = parse_trait_value(value, allow_forbidden=allow_forbidden,
                                 allow_any=allow_any)
        required.extend(expr.required)
        forbidden |= expr.forbidden
    return TraitExpression(required=tuple(required),
                           forbidden=frozenset(forbidden))


def parse_member_of_value(value: str) -> AggregateExpression:
    """One ``member_of`` value: ``uuid``, ``in:a,b``, ``!uuid`` or
    ``!in:a,b``."""
    if "," in value and not (value.startswith("in:")
                             or value.startswith("!in:")):
        raise _bad("Multiple values for 'member_of' must be prefixed with "
                   "the 'in:' or '!in:' keyword using the valid "
                   "microversion. Got: %s" % value)
    required: frozenset[str] = frozenset()
    forbidden: frozenset[str] = frozenset()
    if value.startswith("!in:"):
        forbidden = frozenset(value[4:].split(","))
    elif value.startswith("!"):
        forbidden = frozenset((value[1:],))
    elif value.startswith("in:"):
        required = frozenset(value[3:].split(","))
    else:
        required = frozenset((value,))
    for agg in sorted(required | forbidden):
        if not is_uuid_like(agg):
            raise _bad("Invalid query string parameters: Expected "
                       "'member_of' parameter to contain valid UUID(s). "
                       "Got: %s" % agg)
    return AggregateExpression(
        required=(required,) if required else (), forbidden=forbidden)


def parse_member_of(values: Sequence[str], version: Version,
                    suffix: str = "") -> AggregateExpression:
    """All ``member_of``/``member_ofN`` values of one group.

    Repeating the parameter (ANDed) needs 1.24; forbidden forms need 1.32.
    """
    if version < MULTI_MEMBER_OF_VERSION and len(values) > 1:
        raise _bad("Multiple member_of%s parameters are not supported"
                   % suffix)
    required: list[frozenset[str]] = []
    forbidden: set[str] = set()
    for value in values:
        expr = parse_member_of_value(value)
        required.extend(expr.required)
        if expr.forbidden:
            if version < FORBIDDEN_AGGS_VERSION:
                raise _bad("Forbidden member_of%s parameters are not "
                           "supported in the specified microversion" % suffix)
            forbidden |= expr.forbidden
    return AggregateExpression(required=tuple(required),
                               forbidden=frozenset(forbidden))


def parse_in_tree(value: str) -> str:
    """An ``in_tree``/``in_treeN`` value: a provider UUID (surrounding
    blanks dropped)."""
    stripped = value.strip()
    if not is_uuid_like(stripped):
        raise _bad("Invalid query string parameters: Expected 'in_tree' "
                   "parameter to be a format of uuid. Got: %s" % value)
    return stripped


def parse_root_required(values: Sequence[str]) -> TraitExpression:
    """``root_required`` (1.35): traits the anchor root must have or lack.

    Given once only, and without the ``in:`` form, at any microversion.
    """
    if len(values) > 1:
        raise _bad("Query parameter 'root_required' may be specified only "
                   "once.", code=errors.ILLEGAL_DUPLICATE_QUERYPARAM)
    expr = parse_trait_value(values[0], allow_forbidden=True, allow_any=False)
    required = frozenset().union(*expr.required)
    conflicts = required & expr.forbidden
    if conflicts:
        raise _bad("Conflicting required and forbidden traits found in "
                   "root_required: %s" % ", ".join(sorted(conflicts)),
                   code=errors.QUERYPARAM_BAD_VALUE)
    return TraitExpression(
        required=tuple(frozenset((name,)) for name in sorted(required)),
        forbidden=expr.forbidden)


def parse_same_subtree(values: Sequence[str]) -> tuple[frozenset[str], ...]:
    """``same_subtree`` (1.36): each value is a set of group suffixes."""
    result = []
    for value in values:
        suffixes = frozenset(part.strip() for part in value.split(","))
        if "" in suffixes:
            raise _bad("Empty string (unsuffixed group) can not be specified "
                       "in `same_subtree` ", code=errors.QUERYPARAM_BAD_VALUE)
        result.append(suffixes)
    return tuple(result)


# ---------------------------------------------------------------------------
# The JSON schema Placement applies to the query first
# ---------------------------------------------------------------------------

def group_key_pattern(version: Version) -> re.Pattern[str]:
    """Regex splitting a group key into (prefix, suffix-or-None)."""
    suffix = STRING_SUFFIX if version >= STRING_SUFFIX_VERSION \
        else NUMBERED_SUFFIX
    return re.compile(r"^(%s)(%s)?$" % ("|".join(_GROUP_PREFIXES), suffix))


@functools.lru_cache(maxsize=None)
def allocation_candidates_query_schema(version: Version) -> dict:
    """The JSON schema for the query of ``GET /allocation_candidates``.

    Validated against ``{key: last value}``; jsonschema's error text is what
    clients see after ``Invalid query string parameters: `` (e.g. ``'limit'
    was unexpected``, ``does not match any of the regexes``), so the shape
    of this schema matters, not only what it accepts.  Built once per
    version: treat the result as read-only.
    """
    schema: dict = {
        "type": "object",
        "properties": {"resources": {"type": "string"}},
        "required": ["resources"],
        "additionalProperties": False,
    }
    if version >= LIMIT_VERSION:
        schema["properties"]["limit"] = {
            "type": ["integer", "string"],
            "pattern": "^[1-9][0-9]*$",
            "minimum": 1,
            "minLength": 1,
        }
    if version >= REQUIRED_VERSION:
        schema["properties"]["required"] = {"type": ["string"]}
    if version >= MEMBER_OF_VERSION:
        schema["properties"]["member_of"] = {"type": ["string"]}
    if version < GRANULAR_VERSION:
        return schema

    schema = copy.deepcopy(schema)
    for key in ("resources", "required", "member_of"):
        del schema["properties"][key]
    del schema["required"]
    suffix = STRING_SUFFIX if version >= STRING_SUFFIX_VERSION \
        else NUMBERED_SUFFIX
    prefixes = ["resources", "required", "member_of"]
    if version >= IN_TREE_VERSION:
        prefixes.append("in_tree")
    schema["patternProperties"] = {
        "^%s(%s)?$" % (prefix, suffix): {"type": "string"}
        for prefix in prefixes}
    schema["properties"]["group_policy"] = {
        "type": "string", "enum": list(GROUP_POLICIES)}
    if version >= ROOT_REQUIRED_VERSION:
        schema["properties"]["root_required"] = {"type": ["string"]}
    if version >= SAME_SUBTREE_VERSION:
        schema["properties"]["same_subtree"] = {"type": ["string"]}
    return schema


# ---------------------------------------------------------------------------
# GET /allocation_candidates
# ---------------------------------------------------------------------------

class _GroupDraft:
    """A group while its keys are still being read."""

    __slots__ = ("resources", "traits", "aggregates", "in_tree")

    def __init__(self) -> None:
        self.resources: dict[str, int] = {}
        self.traits: TraitExpression | None = None
        self.aggregates: AggregateExpression | None = None
        self.in_tree: str | None = None


def _values(pairs: Sequence[tuple[str, str]], key: str) -> list[str]:
    return [value for name, value in pairs if name == key]


def _parse_limit(raw: str) -> int:
    """A positive integer; one above :data:`MAX_INT` (more candidates than
    any answer holds) means the same as :data:`MAX_INT`, as Placement
    answers it, without converting a number of any length."""
    # The schema checked only the last 'limit'; the first one is used.
    if not re.match(r"^[1-9][0-9]*$", raw):
        raise _bad("Invalid query string parameters: %r does not match "
                   "'^[1-9][0-9]*$'" % raw)
    if len(raw) > len(str(MAX_INT)):
        return MAX_INT
    return min(int(raw), MAX_INT)


def _parse_group_policy(raw: str) -> str:
    if raw not in GROUP_POLICIES:
        raise _bad("Invalid query string parameters: %r is not one of %r"
                   % (raw, list(GROUP_POLICIES)))
    return raw


def _read_groups(pairs: Sequence[tuple[str, str]],
                 version: Version) -> dict[str, _GroupDraft]:
    pattern = group_key_pattern(version)
    drafts: dict[str, _GroupDraft] = {}
    for key, value in pairs:
        match = pattern.match(key)
        if not match:
            continue
        prefix, suffix = match.group(1), match.group(2) or ""
        if not _key_allowed(prefix, suffix, version):
            continue
        draft = drafts.setdefault(suffix, _GroupDraft())
        if prefix == "resources":
            draft.resources = parse_resources(value)
        elif prefix == "required":
            if draft.traits is None:
                draft.traits = parse_required(_values(pairs, key), version)
        elif prefix == "member_of":
            if draft.aggregates is None:
                draft.aggregates = parse_member_of(
                    _values(pairs, key), version, suffix)
        else:
            draft.in_tree = parse_in_tree(value)
    return drafts


def _key_allowed(prefix: str, suffix: str, version: Version) -> bool:
    """Keys the schema would have refused are ignored when the caller
    skipped schema validation."""
    if suffix and version < GRANULAR_VERSION:
        return False
    if prefix == "required":
        return version >= REQUIRED_VERSION
    if prefix == "member_of":
        return version >= MEMBER_OF_VERSION
    if prefix == "in_tree":
        return version >= IN_TREE_VERSION
    return True


def _check_groups_1_36(groups: Mapping[str, RequestGroup],
                       same_subtrees: Sequence[frozenset[str]],
                       subtree_order: Sequence[str]) -> None:
    """From 1.36 a suffixed group may omit resources if ``same_subtree``
    ties it to others; at least one group must still ask for resources."""
    resourceless = [s for s, grp in groups.items() if not grp.resources]
    if len(resourceless) == len(groups):
        raise _bad("There must be at least one resources or resources[$S] "
                   "parameter.", code=errors.QUERYPARAM_MISSING_VALUE)
    in_subtrees = set().union(*same_subtrees)
    bad = [s for s in resourceless if s not in in_subtrees]
    if bad:
        raise _bad("Resourceless suffixed group request should be specified "
                   "in `same_subtree` query param: bad group(s) - %s." % bad,
                   code=errors.QUERYPARAM_BAD_VALUE)
    unknown = [s for s in subtree_order if s not in groups]
    if unknown:
        raise _bad("Real suffixes should be specified in `same_subtree`: "
                   "%s not found in %s." % (unknown, list(groups)),
                   code=errors.QUERYPARAM_BAD_VALUE)


def _check_orphans(groups: Mapping[str, RequestGroup]) -> None:
    """Before 1.36 every group needs resources of its own."""
    orphans = ["required%s" % s for s, grp in groups.items()
               if grp.traits.required and not grp.resources]
    if orphans:
        raise _bad("All traits parameters must be associated with "
                   "resources.  Found the following orphaned traits keys: %s"
                   % ", ".join(orphans))
    orphans = ["member_of%s" % s for s, grp in groups.items()
               if grp.aggregates and not grp.resources]
    if orphans:
        raise _bad("All member_of parameters must be associated with "
                   "resources. Found the following orphaned member_of keys: "
                   "%s" % ", ".join(orphans))
    if not all(grp.resources for grp in groups.values()):
        raise _bad("All request groups must specify resources.")
    if not groups:
        raise _bad("At least one request group (`resources` or "
                   "`resources{$S}`) is required.")


def _check_conflicting_traits(groups: Mapping[str, RequestGroup]) -> None:
    """A required any-of set made only of forbidden traits can never
    match."""
    conflicts = []
    for suffix, grp in groups.items():
        for any_of in grp.traits.required:
            if any_of <= grp.traits.forbidden:
                conflicts.append("required%s: (%s)"
                                 % (suffix, ", ".join(sorted(any_of))))
    if conflicts:
        raise _bad("Conflicting required and forbidden traits found in the "
                   "following traits keys: %s" % ", ".join(sorted(conflicts)))


def parse_allocation_candidates(
        pairs: Iterable[tuple[str, str]], version: Version) -> AllocationCandidatesRequest:
    """Parse the query of ``GET /allocation_candidates`` (1.10+).

    ``pairs`` are the decoded ``(key, value)`` pairs in query-string order,
    repeats included, that passed :func:`allocation_candidates_query_schema`
    at ``version`` first (the API validates every route's query so, as
    Placement does; values the schema does not look into are checked here).

    :raises allotment.domain.errors.BadRequest: with Placement's message.
    """
    pairs = list(pairs)

    limit = group_policy = None
    root_traits = TraitExpression()
    same_subtrees: tuple[frozenset[str], ...] = ()
    subtree_order: list[str] = []
    if version >= LIMIT_VERSION:
        raw = _values(pairs, "limit")
        if raw:
            limit = _parse_limit(raw[0])
    if version >= GRANULAR_VERSION:
        raw = _values(pairs, "group_policy")
        if raw:
            group_policy = _parse_group_policy(raw[0])
    if version >= ROOT_REQUIRED_VERSION:
        raw = _values(pairs, "root_required")
        if raw:
            root_traits = parse_root_required(raw)
    if version >= SAME_SUBTREE_VERSION:
        raw = _values(pairs, "same_subtree")
        same_subtrees = parse_same_subtree(raw)
        for value in raw:
            for part in value.split(","):
                if part.strip() not in subtree_order:
                    subtree_order.append(part.strip())

    drafts = _read_groups(pairs, version)
    groups = {
        suffix: RequestGroup(
            suffix=suffix,
            resources=draft.resources,
            traits=draft.traits or TraitExpression(),
            aggregates=draft.aggregates or AggregateExpression(),
            in_tree=draft.in_tree)
        for suffix, draft in drafts.items()}

    if version >= SAME_SUBTREE_VERSION:
        _check_groups_1_36(groups, same_subtrees, subtree_order)
    else:
        _check_orphans(groups)
    if version >= FORBIDDEN_TRAITS_VERSION:
        _check_conflicting_traits(groups)
    if group_policy is None and sum(1 for s in groups if s) > 1:
        raise _bad('The "group_policy" parameter is required when specifying '
                   'more than one "resources{N}" parameter.')

    return AllocationCandidatesRequest(
        groups=tuple(groups.values()),
        limit=limit,
        group_policy=group_policy,
        root_traits=root_traits,
        same_subtrees=same_subtrees,
        version=version)
