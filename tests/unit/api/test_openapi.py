"""The OpenAPI document: valid OpenAPI 3.1, complete, and true to the server.

Completeness is checked against the route table; truthfulness against the
upstream conformance suite: every request it sends that Placement accepts
(a 2xx is expected) must be valid against the document of its microversion,
and every request it expects refused by a schema must be invalid.  The
suite's YAML files are read from the conformance runner's cache (where
``tools/conformance`` downloads them on first use); without them that test
is skipped, saying so.
"""

from __future__ import annotations

import copy
import json
import os
import re
import uuid as uuidlib
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import jsonschema
import pytest

from allotment.api import openapi
from allotment.api.http import _FORMAT_CHECKER
from allotment.api.microversion import MAX_VERSION, Version
from allotment.api.routes import OWN_ROUTES, ROUTES, TABLE


@pytest.fixture(scope="module")
def documents() -> dict[Version, dict]:
    return {version: openapi.document(TABLE, version) for version in openapi.versions()}


@pytest.mark.skipif(os.environ.get("ALLOTMENT_TEST_BACKEND", "sqlite") != "sqlite",
                    reason="no database involved: checked once, in the SQLite pass (7 s)")
def test_every_document_is_valid_openapi_3_1(documents):
    from openapi_spec_validator import validate
    from openapi_spec_validator.validation import OpenAPIV31SpecValidator

    assert len(documents) == 40
    for document in documents.values():
        assert document["openapi"] == "3.1.0"
        validate(document, cls=OpenAPIV31SpecValidator)


def test_every_route_is_described_from_the_version_it_appears(documents):
    for table, own in ((ROUTES, False), (OWN_ROUTES, True)):
        for template, methods in table.items():
            for method, endpoint in methods.items():
                for version, document in documents.items():
                    present = method.lower() in document["paths"].get(template, {})
                    expected = own or version >= endpoint.min_version
                    assert present == expected, (method, template, version)
    latest = documents[MAX_VERSION]
    described = {(method.upper(), path) for path, operations in latest["paths"].items() for method in operations}
    declared = {(method, template) for table in (ROUTES, OWN_ROUTES)
                for template, methods in table.items() for method in methods}
    assert described == declared


def test_operation_ids_are_unique(documents):
    ids = [operation["operationId"] for operations in documents[MAX_VERSION]["paths"].values()
           for operation in operations.values()]
    assert len(ids) == len(set(ids))


def test_bodies_follow_the_microversion_with_their_ranges(documents):
    def body(version, method, path):
        operation = documents[version]["paths"][path][method]
        return operation.get("requestBody")

    assert "parent_provider_uuid" not in body(Version(1, 13), "post", "/resource_providers")[
        "content"]["application/json"]["schema"]["properties"]
    created = body(Version(1, 14), "post", "/resource_providers")
    assert "parent_provider_uuid" in created["content"]["application/json"]["schema"]["properties"]
    assert created["x-openstack-microversions"] == {"min": "1.14", "max": "1.39"}
    assert body(Version(1, 30), "put", "/allocations/{consumer_uuid}")["x-openstack-microversions"] == {
        "min": "1.28", "max": "1.33"}
    # A rename until 1.6; no body from 1.7.
    assert body(Version(1, 6), "put", "/resource_classes/{name}") is not None
    assert body(Version(1, 7), "put", "/resource_classes/{name}") is None
    assert "/reshaper" not in documents[Version(1, 29)]["paths"]


def test_errors_carry_a_code_from_1_23(documents):
    def required(version):
        error = documents[version]["components"]["schemas"]["Error"]
        return error["properties"]["errors"]["items"]["required"]

    assert "code" not in required(Version(1, 22))
    assert "code" in required(Version(1, 23))


def test_links_lead_from_a_new_provider_to_what_uses_its_uuid(documents):
    created = documents[MAX_VERSION]["paths"]["/resource_providers"]["post"]["responses"]["200"]
    links = created["links"]
    assert links["get_inventories"]["parameters"] == {"uuid": "$response.body#/uuid"}
    assert "update_traits_for_resource_provider" in links
    # Before 1.20 the answer has no body to take the uuid from.
    assert "links" not in documents[Version(1, 19)]["paths"]["/resource_providers"]["post"]["responses"]["201"]


# -- the conformance suite's requests ------------------------------------------

def gabbits_directory() -> Path | None:
    home = os.environ.get("PLACEMENT_CONFORMANCE_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "placement-conformance")
    found = sorted(Path(home).glob("gabbits-*"))
    return found[-1] if found and list(found[-1].glob("*.yaml")) else None


_METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS")
_NAMES = {"CUSTOM_RES_CLASS": "CUSTOM_IRON_NFV", "CUSTOM_RES_CLASS1": "CUSTOM_IRON_NFV1",
          "CUSTOM_RES_CLASS2": "CUSTOM_IRON_NFV2"}
_TEMPLATE = re.compile(r"(\$HISTORY\[[^\]]*\]\.)?\$RESPONSE\[(['\"])(.*?)\2\]|\$ENVIRON\['(\w+)'\]")


class Unresolvable(Exception):
    pass


def _stand_in(path: str):
    """A plausible value for ``$RESPONSE[path]`` (the suite's responses are not replayed)."""
    if "generation" in path:
        return 1
    if path.endswith("mappings']") or path.endswith("mappings"):
        return {"NET1": [str(uuidlib.uuid4())]}
    if path.endswith("allocations"):
        return {str(uuidlib.uuid4()): {"resources": {"VCPU": 1}}}
    if "inventories" in path and "href" in path:
        return f"/resource_providers/{uuidlib.uuid4()}/inventories"
    if "uuid" in path:
        return str(uuidlib.uuid4())
    raise Unresolvable(path)


def _resolve(value):
    """The value with gabbi's templates replaced by stand-ins of the right type."""
    if isinstance(value, dict):
        return {_resolve(key): _resolve(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item) for item in value]
    if not isinstance(value, str):
        return value
    whole = _TEMPLATE.fullmatch(value)
    if whole and whole.group(3) is not None:
        return _stand_in(whole.group(3))

    def text(match):
        if match.group(4):
            name = match.group(4)
            return _NAMES.get(name) or ("rp-" + name.lower() if "NAME" in name
                                        else str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name)))
        return str(_stand_in(match.group(3)))

    return _TEMPLATE.sub(text, value)


def _version(headers: dict) -> Version | None:
    value = {key.lower(): item for key, item in headers.items()}.get("openstack-api-version")
    if value is None:
        return Version(1, 0)
    text = str(value).split()[-1]
    if text == "latest":
        return MAX_VERSION
    try:
        return openapi.parse_version(text)
    except ValueError:
        return None


def conformance_requests(directory: Path):
    """(file, test name, method, url, version, body or None, expected status, response texts)."""
    import yaml

    for path in sorted(directory.glob("*.yaml")):
        content = yaml.safe_load(path.read_text())
        defaults = content.get("defaults", {})
        last_url = None
        previous = None
        history: dict[str, str] = {}
        for test in content.get("tests", []):
            test = {**copy.deepcopy(defaults), **test}
            headers = {**defaults.get("request_headers", {}), **(test.get("request_headers") or {})}
            method = next((m for m in _METHODS if m in test), test.get("method", "GET"))
            url = test.get(method, test.get("url"))
            try:
                url = re.sub(r"\$HISTORY\['([^']*)'\]\.\$URL", lambda m: history[m.group(1)], url)
                if "$LAST_URL" in url:
                    url = url.replace("$LAST_URL", last_url)
                if "$LOCATION" in url:
                    if previous is None:
                        raise Unresolvable("$LOCATION after an unresolvable request")
                    url = url.replace("$LOCATION", _location(previous))
                url = _resolve(url)
                body = _resolve(test["data"]) if "data" in test else None
            except (Unresolvable, TypeError, KeyError) as error:
                last_url = previous = None  # what follows cannot lean on it
                yield path.name, test["name"], None, str(error), None, None, None, None
                continue
            if test.get("query_parameters"):
                pairs = [(key, item) for key, value in test["query_parameters"].items()
                         for item in (value if isinstance(value, list) else [value])]
                url += ("&" if "?" in url else "?") + "&".join(f"{k}={_resolve(str(v))}" for k, v in pairs)
            status = str(test.get("status", 200))
            texts = json.dumps([test.get("response_strings"), test.get("response_json_paths")])
            last_url = history[test["name"]] = url
            previous = (method, url, body)
            yield path.name, test["name"], method, url, _version(headers), body, status, texts


def _location(previous) -> str:
    """Where the previous request's answer pointed (gabbi's ``$LOCATION``)."""
    method, url, body = previous
    if method == "POST" and isinstance(body, dict):
        key = {"/resource_providers": "uuid", "/resource_classes": "name",
               "/inventories": "resource_class"}.get(url[url.rfind("/"):])
        if key not in body:
            raise Unresolvable(f"$LOCATION of POST {url} without {key}")
        return f"{url}/{body[key]}"
    return url


def request_problems(document: dict, method: str, url: str, body) -> list[str]:
    """What makes a request invalid against ``document`` (empty: it is valid)."""
    parts = urlsplit(url)
    for template, operations in document["paths"].items():
        pattern = "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template) + "$"
        found = re.match(pattern, parts.path)
        if found:
            break
    else:
        return [f"no path matches {parts.path}"]
    operation = operations.get(method.lower())
    if operation is None:
        return [f"{method} is not an operation of {template}"]
    problems = []
    parameters = [p for p in operation.get("parameters", []) if "$ref" not in p]
    for parameter in parameters:
        if parameter["in"] == "path":
            problems += _invalid(found.group(parameter["name"]), parameter["schema"])
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = dict(pairs)
    named = {p["name"]: p for p in parameters if p["in"] == "query"}
    groups = next((p for p in parameters if p["in"] == "query" and p.get("explode")), None)
    for name, parameter in named.items():
        if name not in query and parameter.get("required") and name != "request_groups":
            problems.append(f"query parameter {name} is required")
    for key, value in query.items():
        if key in named and named[key] is not groups:
            problems += _invalid(value, named[key]["schema"])
        elif groups and any(re.search(p, key) for p in groups["schema"]["patternProperties"]):
            continue
        else:
            problems.append(f"unknown query parameter {key}")
    if "x-query-schema" in operation:
        problems += _invalid(query, operation["x-query-schema"])
    request_body = operation.get("requestBody")
    if body is not None and request_body is None:
        problems.append("a body where none is described")
    elif request_body is not None:
        if body is None:
            problems.append("no body")
        elif isinstance(body, str):
            problems.append("a body that is not JSON")
        else:
            problems += _invalid(body, request_body["content"]["application/json"]["schema"])
    return problems


def _invalid(value, schema: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema, format_checker=_FORMAT_CHECKER)
    return [error.message for error in validator.iter_errors(value)]


def test_every_request_of_the_conformance_suite_is_judged_as_the_server_does(documents):
    directory = gabbits_directory()
    if directory is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the conformance suite's YAML files are missing under CI: scripts/test fetches them "
                        "before pytest (tools/conformance's runner, first use)")
        pytest.skip("the conformance suite's YAML files are not in the runner's cache "
                    "(~/.cache/placement-conformance/gabbits-*): run tools/conformance once to fetch them")
    accepted_checked = refused_checked = 0
    wrong = []
    for file, name, method, url, version, body, status, texts in conformance_requests(directory):
        if method is None or version is None or method not in ("GET", "PUT", "POST", "DELETE"):
            continue  # unresolvable stand-ins, bad microversion headers, methods no route has
        problems = request_problems(documents[version], method, url, body)
        if status.startswith("2"):
            accepted_checked += 1
            if problems:
                wrong.append(f"{file} / {name}: accepted by Placement, invalid here: {problems}")
        elif status == "400" and ("JSON does not validate" in texts or "Additional properties" in texts):
            refused_checked += 1
            if not problems:
                wrong.append(f"{file} / {name}: refused by its schema, valid here")
    assert not wrong, "\n".join(wrong)
    # The suite sends some 750 accepted requests (730 resolvable without
    # replaying responses) and 42 that its schemas refuse.
    assert accepted_checked > 700, accepted_checked
    assert refused_checked > 35, refused_checked
