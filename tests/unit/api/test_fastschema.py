"""fastschema's yes must always be jsonschema's yes (its no costs only time)."""

from __future__ import annotations

import importlib
import pkgutil
import random

import jsonschema
import pytest

import allotment.api
from allotment.api import http
from allotment.domain import fastschema


def _schemas() -> list[tuple[str, dict]]:
    found: dict[int, tuple[str, dict]] = {}
    for info in pkgutil.iter_modules(allotment.api.__path__):
        module = importlib.import_module(f"allotment.api.{info.name}")
        for name, value in vars(module).items():
            if "SCHEMA" in name and isinstance(value, dict) and ("type" in value or "properties" in value):
                found[id(value)] = (f"{info.name}.{name}", value)
    return list(found.values())


SCHEMAS = _schemas()
UUIDS = ["9d5f4c0c-2b7a-4d3e-8f0e-1c2b3a4d5e6f", "9D5F4C0C2B7A4D3E8F0E1C2B3A4D5E6F", "not-a-uuid",
         "{9d5f4c0c-2b7a-4d3e-8f0e-1c2b3a4d5e6f}", "9d5f4c0c-2b7a-4d3e-8f0e-1c2b3a4d5e6"]
KEYS = ["allocations", "resources", "resource_provider", "uuid", "project_id", "user_id", "consumer_generation",
        "consumer_type", "mappings", "generation", "name", "parent_provider_uuid", "inventories", "total",
        "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio", "traits", "aggregates",
        "resource_provider_generation", "VCPU", "MEMORY_MB", "CUSTOM_X", "lower", "", "g1"] + UUIDS
SCALARS = [0, 1, -1, 2**31, 2**63, 1.0, 0.5, -0.5, True, False, None, "", "x", "INSTANCE", "lower",
           "A" * 256, "VCPU", "\u00e9"] + UUIDS


def _value(rng: random.Random, depth: int):
    roll = rng.random()
    if depth > 4 or roll < 0.45:
        return rng.choice(SCALARS)
    if roll < 0.6:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def _valid_like(rng: random.Random) -> dict:
    rp = rng.choice(UUIDS)
    body = {"allocations": {rp: {"resources": {rng.choice(["VCPU", "MEMORY_MB", "lower"]): rng.choice([1, 0, 2, True, 1.0])}}},
            "project_id": rng.choice(["p", ""]), "user_id": "u",
            "consumer_generation": rng.choice([None, 0, 1, "1"]), "consumer_type": rng.choice(["INSTANCE", "x"])}
    for key in rng.sample(list(body), rng.randint(0, 2)):
        body.pop(key)
    if rng.random() < 0.2:
        body[rng.choice(KEYS)] = _value(rng, 2)
    return body if rng.random() < 0.7 else {rng.choice(UUIDS): body}


def _example(schema: dict, rng: random.Random, depth: int = 0):
    """A document built to satisfy ``schema`` (most of the time)."""
    kinds = schema.get("type", "object")
    kind = rng.choice(kinds) if isinstance(kinds, list) else kinds
    if kind == "object":
        out = {}
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key in schema.get("required", []) or rng.random() < 0.5:
                out[key] = _example(sub, rng, depth + 1)
        for pattern, sub in schema.get("patternProperties", {}).items():
            keys = [k for k in KEYS if __import__("re").search(pattern, k)]
            for key in rng.sample(keys, min(len(keys), rng.randint(1, 2))):
                out[key] = _example(sub, rng, depth + 1)
        return out
    if kind == "array":
        return [_example(schema.get("items", {}), rng, depth + 1) for _ in range(max(1, schema.get("minItems", 0)))]
    if kind == "integer":
        return max(schema.get("minimum", 0), rng.choice([0, 1, 5]))
    if kind == "number":
        return max(schema.get("minimum", 0), rng.choice([0, 1.5, 16.0]))
    if kind == "boolean":
        return rng.choice([True, False])
    if kind == "null":
        return None
    if schema.get("format") == "uuid":
        return rng.choice(UUIDS[:2])
    pattern = schema.get("pattern")
    candidates = [k for k in KEYS + [s for s in SCALARS if isinstance(s, str)]
                  if pattern is None or __import__("re").search(pattern, k)]
    candidates = [c for c in candidates if schema.get("minLength", 0) <= len(c) <= schema.get("maxLength", 10**6)]
    return rng.choice(candidates or ["x"])


def _mutated(document, rng: random.Random):
    """``document`` with one leaf replaced, one key dropped or one added."""
    if isinstance(document, dict) and document and rng.random() < 0.7:
        key = rng.choice(list(document))
        roll = rng.random()
        copy = dict(document)
        if roll < 0.2:
            copy.pop(key)
        elif roll < 0.3:
            copy[rng.choice(KEYS)] = _value(rng, 3)
        else:
            copy[key] = _mutated(document[key], rng)
        return copy
    if isinstance(document, list) and document and rng.random() < 0.7:
        copy = list(document)
        index = rng.randrange(len(copy))
        copy[index] = _mutated(copy[index], rng)
        return copy
    return rng.choice(SCALARS) if rng.random() < 0.7 else _value(rng, 3)


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[name for name, _ in SCHEMAS])
def test_a_quick_yes_is_always_jsonschemas_yes(name, schema):
    check = fastschema.compile(schema, http._FORMAT_CHECKER)
    if check is None:
        pytest.skip("no quick check for this schema")
    validator = http._validator(schema)
    rng = random.Random(name)
    accepted = valids = 0
    for _ in range(1500):
        roll = rng.random()
        if roll < 0.5:
            document = _example(schema, rng)
            for _ in range(rng.randint(0, 2)):
                document = _mutated(document, rng)
        else:
            document = _valid_like(rng) if roll < 0.8 else _value(rng, 0)
        quick = check(document)
        valid = validator.is_valid(document)
        assert valid or not quick, (name, document)
        accepted += quick
        valids += valid
    # And it is a yes for (nearly) every valid document met, or it is of no use.
    assert accepted >= 0.9 * valids, (accepted, valids)


def test_the_claim_body_has_a_quick_yes():
    from allotment.api import allocations

    body = {"allocations": {UUIDS[0]: {"resources": {"VCPU": 1, "MEMORY_MB": 512}}}, "project_id": "p",
            "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}
    check = fastschema.compile(allocations.PUT_SCHEMA_V1_38, http._FORMAT_CHECKER)
    assert check is not None and check(body)
    body["allocations"][UUIDS[0]]["resources"]["VCPU"] = 0
    assert not check(body)


def test_unknown_keywords_mean_no_quick_check():
    assert fastschema.compile({"type": "object", "oneOf": [{}]}, None) is None
    assert fastschema.compile({"type": "integer", "exclusiveMinimum": True, "minimum": 0}, None) is None
    assert fastschema.compile({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}, None) is None


def _query_schemas() -> list[tuple[str, dict]]:
    """Every route's query schema at every version that changes it."""
    from allotment.api.endpoint import schema_at
    from allotment.api.routes import OWN_ROUTES, ROUTES

    found: dict[int, tuple[str, dict]] = {}
    for table in (ROUTES, OWN_ROUTES):
        for template, methods in table.items():
            for method, endpoint in methods.items():
                for minor in range(0, 40):
                    schema = schema_at(endpoint.query, (1, minor))
                    if schema is not None:
                        found.setdefault(id(schema), (f"{method} {template} 1.{minor}", schema))
    return list(found.values())


QUERY_SCHEMAS = _query_schemas()
QUERY_KEYS = ["resources", "resources1", "resources_CPU", "resources_", "required", "required2", "member_of",
              "member_of_X", "in_tree", "in_tree1", "limit", "group_policy", "root_required", "same_subtree",
              "name", "uuid", "project_id", "user_id", "consumer_type", "associated", "format", "x", ""]
QUERY_VALUES = ["", "1", "0", "01", "10", "-1", "1.5", "none", "isolate", "None", "true", "x", "VCPU:1",
                "in:A,B", "\u00e9", "a\x00b"] + UUIDS


@pytest.mark.parametrize("name,schema", QUERY_SCHEMAS, ids=[name for name, _ in QUERY_SCHEMAS])
def test_query_schemas_have_a_quick_yes_that_is_jsonschemas(name, schema):
    """Query strings are checked with the quick yes first too, so a query
    jsonschema refuses must never pass it."""
    rng = random.Random(name)
    checks = [(fastschema.compile(schema, http._FORMAT_CHECKER), http._validator(schema))]
    for check, validator in checks:
        assert check is not None, name
        accepted = valids = 0
        for _ in range(1500):
            keys = rng.sample(QUERY_KEYS, rng.randint(0, 4))
            if rng.random() < 0.5:  # mostly known keys
                keys = [k for k in keys if k in schema.get("properties", {})] + ["resources"] * rng.randint(0, 1)
            document = {key: rng.choice(QUERY_VALUES) for key in keys}
            quick = check(document)
            valid = validator.is_valid(document)
            assert valid or not quick, (name, document)
            accepted += quick
            valids += valid
        assert accepted == valids, (accepted, valids)


def test_enum_tells_types_apart():
    check = fastschema.compile({"enum": ["none", 1]}, None)
    assert check("none") and check(1)
    assert not check(True) and not check(1.0) and not check("1") and not check(["none"])
