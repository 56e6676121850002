"""Parsing the query language of GET /allocation_candidates.

Messages are asserted verbatim where clients (and the upstream functional
suite) match on them.  A query is checked against its JSON schema first,
as the API checks every route's query (``http.check_query``), then parsed.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from allotment.api.errors import HTTPError
from allotment.api.http import check_query
from allotment.domain import errors
from allotment.domain import request_groups as rg

AGG1 = "11111111-1111-4111-8111-111111111111"
AGG2 = "22222222-2222-4222-8222-222222222222"
RP1 = "33333333-3333-4333-8333-333333333333"


def parse(query: str, version=(1, 39)):
    pairs = parse_qsl(query, keep_blank_values=True)
    check_query(pairs, rg.allocation_candidates_query_schema(version))
    return rg.parse_allocation_candidates(pairs, version)


def error(query: str, version=(1, 39)) -> errors.BadRequest | HTTPError:
    with pytest.raises((errors.BadRequest, HTTPError)) as info:
        parse(query, version)
    return info.value


# ---------------------------------------------------------------------------
# resources
# ---------------------------------------------------------------------------

class TestResources:
    def test_amounts_in_order(self):
        assert rg.parse_resources("VCPU:2,MEMORY_MB:1024") == {
            "VCPU": 2, "MEMORY_MB": 1024}

    def test_empty(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_resources("  ")
        assert info.value.message == (
            "Badly formed resources parameter. Expected resources query "
            "string parameter in form: ?resources=VCPU:2,MEMORY_MB:1024. "
            "Got: empty string.")

    @pytest.mark.parametrize("value,got", [
        ("VCPU", "Got: VCPU."),
        ("DISK_GB:500,", "Got: ."),
        ("VCPU:1:2", "Got: VCPU:1:2."),
    ])
    def test_badly_formed(self, value, got):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_resources(value)
        assert info.value.message.startswith(
            "Badly formed resources parameter. Expected resources query "
            "string parameter in form:")
        assert info.value.message.endswith(got)

    def test_not_an_integer(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_resources("VCPU:fred")
        assert info.value.message == (
            "Requested resource VCPU expected positive integer amount. "
            "Got: fred.")

    def test_below_one(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_resources("VCPU:-2")
        assert info.value.message == (
            "Requested resource VCPU requires amount >= 1. Got: -2.")

    def test_repeated_class_keeps_last(self):
        assert rg.parse_resources("VCPU:1,VCPU:3") == {"VCPU": 3}


# ---------------------------------------------------------------------------
# required
# ---------------------------------------------------------------------------

class TestRequired:
    def test_all_of_and_forbidden(self):
        expr = rg.parse_required(["A,!B,C"], (1, 22))
        assert expr.required == (frozenset({"A"}), frozenset({"C"}))
        assert expr.forbidden == {"B"}

    def test_forbidden_needs_1_22(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_required(["!CUSTOM_MAGIC"], (1, 17))
        assert info.value.message == (
            "Invalid query string parameters: Expected 'required' parameter "
            "value of the form: HW_CPU_X86_VMX,CUSTOM_MAGIC. "
            "Got: !CUSTOM_MAGIC")

    @pytest.mark.parametrize("version,form", [
        ((1, 17), "HW_CPU_X86_VMX,CUSTOM_MAGIC"),
        ((1, 22), "HW_CPU_X86_VMX,!CUSTOM_MAGIC"),
    ])
    @pytest.mark.parametrize("value", ["", ",,", "A,,B", "A,!"])
    def test_empty_trait(self, version, form, value):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_required([value], version)
        assert info.value.message.startswith(
            "Invalid query string parameters: Expected 'required' parameter "
            "value of the form: %s." % form)

    def test_repeated_bangs_forbid_the_name(self):
        assert rg.parse_required(["!!A"], (1, 22)).forbidden == {"A"}

    def test_any_of_needs_1_39(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_required(["in:A,B"], (1, 38))
        assert info.value.message == (
            "Invalid query string parameters: The format "
            "'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only supported since "
            "microversion 1.39. Got: in:A,B")

    def test_any_of(self):
        expr = rg.parse_required(["in:A, B", "C,!D"], (1, 39))
        assert expr.required == (frozenset({"A", "B"}), frozenset({"C"}))
        assert expr.forbidden == {"D"}

    def test_any_of_rejects_forbidden_and_empty(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_required(["in:A,!B"], (1, 39))
        assert "does not support forbidden traits. Got: in:A,!B" in \
            info.value.message
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_required(["in:A,"], (1, 39))
        assert "Got an empty trait in: in:A," in info.value.message

    def test_last_value_wins_before_1_39(self):
        expr = rg.parse_required(["A", "B"], (1, 38))
        assert expr.required == (frozenset({"B"}),)

    def test_expression_matching(self):
        expr = rg.parse_required(["in:A,B", "C,!D"], (1, 39))
        assert expr.matches({"A", "C"})
        assert not expr.matches({"A"})
        assert not expr.matches({"B", "C", "D"})
        assert expr.names() == {"A", "B", "C", "D"}


# ---------------------------------------------------------------------------
# member_of and in_tree
# ---------------------------------------------------------------------------

class TestMemberOf:
    def test_forms(self):
        expr = rg.parse_member_of(
            [AGG1, "in:%s,%s" % (AGG1, AGG2), "!%s" % AGG2], (1, 32))
        assert expr.required == (frozenset({AGG1}), frozenset({AGG1, AGG2}))
        assert expr.forbidden == {AGG2}
        assert expr.matches({AGG1})
        assert not expr.matches({AGG1, AGG2})

    def test_multiple_needs_1_24(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_member_of([AGG1, AGG2], (1, 23))
        assert info.value.message == \
            "Multiple member_of parameters are not supported"
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_member_of([AGG1, AGG2], (1, 23), "3")
        assert info.value.message == \
            "Multiple member_of3 parameters are not supported"

    def test_comma_needs_in(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_member_of(["%s,%s" % (AGG1, AGG2)], (1, 24))
        assert info.value.message.startswith(
            "Multiple values for 'member_of' must be prefixed with the 'in:' "
            "or '!in:' keyword using the valid microversion. Got: ")

    @pytest.mark.parametrize("value", [
        "INVALID_UUID", "in:", "in:%s,INVALID" % AGG1, "!(^o^)",
        "in:%s,!%s" % (AGG1, AGG2)])
    def test_invalid_uuid(self, value):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_member_of([value], (1, 32))
        assert info.value.message.startswith(
            "Invalid query string parameters: Expected 'member_of' parameter "
            "to contain valid UUID(s).")

    @pytest.mark.parametrize("value", ["!%s" % AGG1, "!in:%s" % AGG1])
    def test_forbidden_needs_1_32(self, value):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_member_of([value], (1, 31))
        assert info.value.message == ("Forbidden member_of parameters are "
                                      "not supported in the specified "
                                      "microversion")


class TestInTree:
    def test_strips(self):
        assert rg.parse_in_tree(" %s " % RP1) == RP1

    def test_invalid(self):
        with pytest.raises(errors.BadRequest) as info:
            rg.parse_in_tree("life-is-beautiful")
        assert info.value.message == (
            "Invalid query string parameters: Expected 'in_tree' parameter "
            "to be a format of uuid. Got: life-is-beautiful")

    @pytest.mark.parametrize("value,ok", [
        (RP1, True), (RP1.upper(), True), (RP1.replace("-", ""), True),
        ("{%s}" % RP1, True), ("urn:uuid:%s" % RP1, True),
        (RP1[:-1], False), ("", False), ("x" * 32, False)])
    def test_uuid_like(self, value, ok):
        assert rg.is_uuid_like(value) is ok


# ---------------------------------------------------------------------------
# Schema stage
# ---------------------------------------------------------------------------

class TestSchema:
    def test_resources_required_before_granular(self):
        assert "'resources' is a required property" in \
            error("", (1, 10)).message

    @pytest.mark.parametrize("query,version,fragment", [
        ("resources=VCPU:1&limit=5", (1, 15), "'limit' was unexpected"),
        ("resources=VCPU:1&required=A", (1, 16), "'required' was unexpected"),
        ("resources=VCPU:1&member_of=%s" % AGG1, (1, 18),
         "'member_of' was unexpected"),
        ("resources=VCPU:1&resources1=VCPU:1", (1, 24),
         "'resources1' was unexpected"),
        ("resources=VCPU:1&group_policy=none", (1, 24),
         "'group_policy' was unexpected"),
        ("resources01=VCPU:1", (1, 25),
         "'resources01' does not match any of the regexes"),
        ("resources1@=VCPU:1", (1, 33),
         "^member_of([a-zA-Z0-9_-]{1,64})?$"),
        ("resources_%s=VCPU:1" % ("01234567" * 8 + "0"), (1, 33),
         "does not match any of the regexes"),
        ("resources=VCPU:1&root_required=A", (1, 34),
         "'root_required' does not match any of the regexes"),
        ("resources=VCPU:1&in_tree=%s" % RP1, (1, 30),
         "'in_tree' does not match any of the regexes"),
        ("resources=VCPU:1&group_policy=bogus", (1, 25),
         "'bogus' is not one of ['none', 'isolate']"),
        ("resources=VCPU:1&limit=cow", (1, 16), "Failed validating 'pattern'"),
        ("resources=VCPU:1&limit=0", (1, 16), "Failed validating 'pattern'"),
        ("resources=VCPU:1&limit=-99", (1, 16),
         "Failed validating 'pattern'"),
    ])
    def test_rejected(self, query, version, fragment):
        message = error(query, version).message
        assert message.startswith("Invalid query string parameters")
        assert fragment in message

    def test_schema_sees_last_value_parser_uses_first(self):
        request = parse("resources=VCPU:1&limit=10&limit=1", (1, 16))
        assert request.limit == 10

    def test_first_group_policy_wins(self):
        request = parse("resources1=VCPU:1&resources2=VCPU:1"
                        "&group_policy=isolate&group_policy=none", (1, 25))
        assert request.group_policy == "isolate"

    def test_without_schema_odd_values_still_rejected(self):
        with pytest.raises(errors.BadRequest):
            rg.parse_allocation_candidates(
                [("resources", "VCPU:1"), ("limit", "cow")], (1, 16))


# ---------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------

class TestGroups:
    def test_full_request(self):
        request = parse(
            "resources=VCPU:2,MEMORY_MB:512&required=A,!B"
            "&member_of=in:%s,%s&in_tree=%s"
            "&resources_NET=SRIOV_NET_VF:1&required_NET=in:P1,P2"
            "&required_NET=C&member_of_NET=!%s"
            "&group_policy=isolate&limit=3&root_required=R,!S"
            % (AGG1, AGG2, RP1, AGG2))
        unsuffixed, net = request.groups
        assert unsuffixed.suffix == "" and not unsuffixed.use_same_provider
        assert dict(unsuffixed.resources) == {"VCPU": 2, "MEMORY_MB": 512}
        assert unsuffixed.traits.required == (frozenset({"A"}),)
        assert unsuffixed.traits.forbidden == {"B"}
        assert unsuffixed.aggregates.required == (frozenset({AGG1, AGG2}),)
        assert unsuffixed.in_tree == RP1
        assert net.suffix == "_NET" and net.use_same_provider
        assert net.traits.required == (frozenset({"P1", "P2"}),
                                       frozenset({"C"}))
        assert net.aggregates.forbidden == {AGG2}
        assert request.limit == 3 and request.isolate
        assert request.root_traits.required == (frozenset({"R"}),)
        assert request.root_traits.forbidden == {"S"}
        assert request.resource_class_names() == [
            "VCPU", "MEMORY_MB", "SRIOV_NET_VF"]
        assert request.trait_names() == {"A", "B", "P1", "P2", "C", "R", "S"}
        assert request.aggregate_uuids() == {AGG1, AGG2}
        assert request.in_tree_uuids() == {RP1}

    def test_groups_keep_first_appearance_order(self):
        request = parse("required2=A&resources1=VCPU:1&resources2=VCPU:1"
                        "&group_policy=none", (1, 25))
        assert [g.suffix for g in request.groups] == ["2", "1"]

    def test_nested_awareness(self):
        assert not parse("resources=VCPU:1", (1, 28)).nested_aware
        assert parse("resources=VCPU:1", (1, 29)).nested_aware

    def test_group_policy_required_for_two_suffixed_groups(self):
        assert error("resources1=VCPU:1&resources2=VCPU:1",
                     (1, 25)).message == (
            'The "group_policy" parameter is required when specifying more '
            'than one "resources{N}" parameter.')

    def test_group_policy_not_required_for_one(self):
        parse("resources=VCPU:1&resources1=MEMORY_MB:2048", (1, 25))

    def test_numbered_suffix_before_1_33(self):
        assert "does not match any of the regexes" in error(
            "resources_A=VCPU:1", (1, 32)).message

    def test_string_suffixes(self):
        request = parse("resources_compute=VCPU:1&resources-port=VF:1"
                        "&group_policy=none", (1, 33))
        assert [g.suffix for g in request.groups] == ["_compute", "-port"]


class TestOrphansBefore1_36:
    def test_orphaned_traits(self):
        assert error("required=FOO&required1=BAR", (1, 25)).message == (
            "All traits parameters must be associated with resources.  "
            "Found the following orphaned traits keys: required, required1")

    def test_orphaned_member_of(self):
        assert error("member_of=%s&member_of3=%s" % (AGG1, AGG2),
                     (1, 25)).message == (
            "All member_of parameters must be associated with resources. "
            "Found the following orphaned member_of keys: member_of, "
            "member_of3")

    def test_orphaned_forbidden_aggregate(self):
        assert "All member_of parameters must be associated with resources" \
            in error("member_of=!%s" % AGG1, (1, 32)).message

    def test_group_without_resources(self):
        assert error("resources=VCPU:1&in_tree1=%s" % RP1,
                     (1, 31)).message == \
            "All request groups must specify resources."

    def test_no_group_at_all(self):
        assert error("group_policy=isolate", (1, 25)).message == (
            "At least one request group (`resources` or `resources{$S}`) "
            "is required.")


class TestSameSubtree:
    def test_resourceless_needs_same_subtree(self):
        exc = error("resources1=VCPU:1&required2=A&group_policy=none",
                    (1, 36))
        assert exc.message == (
            "Resourceless suffixed group request should be specified in "
            "`same_subtree` query param: bad group(s) - ['2'].")
        assert exc.code == errors.QUERYPARAM_BAD_VALUE

    def test_resourceless_allowed_in_same_subtree(self):
        request = parse("resources_A=VCPU:1&required_B=X"
                        "&same_subtree=_A,_B&group_policy=none", (1, 36))
        assert request.group("_B").is_resourceless
        assert request.same_subtrees == (frozenset({"_A", "_B"}),)

    def test_needs_some_resources(self):
        exc = error("member_of1=%s&group_policy=none" % AGG1, (1, 36))
        assert exc.message == ("There must be at least one resources or "
                               "resources[$S] parameter.")
        assert exc.code == errors.QUERYPARAM_MISSING_VALUE

    def test_unsuffixed_cannot_be_resourceless(self):
        assert "bad group(s) - ['']." in error(
            "required=A&resources_X=VCPU:1", (1, 36)).message

    def test_unknown_suffix(self):
        exc = error("resources_COMPUTE=VCPU:1&resources_ACCEL=FPGA:1"
                    "&same_subtree=COMPUTE,_ACCEL&group_policy=none",
                    (1, 36))
        assert exc.message == (
            "Real suffixes should be specified in `same_subtree`: "
            "['COMPUTE'] not found in ['_COMPUTE', '_ACCEL'].")
        assert exc.code == errors.QUERYPARAM_BAD_VALUE

    def test_empty_suffix(self):
        exc = error("resources_COMPUTE=VCPU:1&resources_ACCEL=FPGA:1"
                    "&same_subtree=_COMPUTE,,_ACCEL&group_policy=none",
                    (1, 36))
        assert exc.message.startswith(
            "Empty string (unsuffixed group) can not be specified in "
            "`same_subtree`")
        assert exc.code == errors.QUERYPARAM_BAD_VALUE

    def test_duplicates_squashed(self):
        request = parse("required_N=A&resources_A1=FPGA:1&resources_A2=FPGA:1"
                        "&same_subtree=_N,_A1,_A2,_N,_A1"
                        "&group_policy=isolate", (1, 36))
        assert request.same_subtrees == (frozenset({"_N", "_A1", "_A2"}),)


class TestRootRequired:
    def test_only_once(self):
        exc = error("resources=VCPU:1&root_required=A&root_required=!B",
                    (1, 35))
        assert exc.message == \
            "Query parameter 'root_required' may be specified only once."
        assert exc.code == errors.ILLEGAL_DUPLICATE_QUERYPARAM

    def test_conflict(self):
        exc = error("resources=VCPU:1&root_required=A,B,!A", (1, 35))
        assert exc.message == ("Conflicting required and forbidden traits "
                               "found in root_required: A")
        assert exc.code == errors.QUERYPARAM_BAD_VALUE

    def test_no_any_of_even_at_1_39(self):
        assert "only supported since microversion 1.39" in error(
            "resources=VCPU:1&root_required=in:A,B", (1, 39)).message


class TestConflicts:
    def test_required_and_forbidden(self):
        assert error("resources=VCPU:1&required=A,!A&resources1=DISK_GB:1"
                     "&required1=in:B,C&required1=!B,!C", (1, 39)
                     ).message == (
            "Conflicting required and forbidden traits found in the "
            "following traits keys: required1: (B, C), required: (A)")

    def test_any_of_partly_forbidden_is_fine(self):
        parse("resources=VCPU:1&required=in:A,B&required=!A", (1, 39))


class TestErrorOrder:
    def test_request_wide_before_groups(self):
        assert "root_required" in error(
            "resources=VCPU:x&root_required=A&root_required=B",
            (1, 35)).message

    def test_groups_in_query_order(self):
        assert "Requested resource VCPU" in error(
            "resources=VCPU:x&member_of=bad", (1, 24)).message
        assert "member_of" in error(
            "member_of=bad&resources=VCPU:x", (1, 24)).message
