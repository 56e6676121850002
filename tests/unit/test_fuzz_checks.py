"""The fuzzer's check (tools/fuzz_checks.py) catches what it is there to catch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson
import pytest

pytest.importorskip("schemathesis")

_PATH = Path(__file__).resolve().parents[2] / "tools" / "fuzz_checks.py"
_SPEC = importlib.util.spec_from_file_location("allotment_fuzz_checks", _PATH)
checks = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(checks)

RID = "req-5e0b8cfa-0f0e-4d3c-9d2a-8a1f7a0c2b11"
JSON = {"x-openstack-request-id": RID, "content-type": "application/json"}


def error(status=404, **fields) -> bytes:
    entry = {"status": status, "title": "Not Found", "detail": "The resource could not be found.",
             "request_id": RID, "code": "placement.undefined_code"}
    entry.update(fields)
    return orjson.dumps({"errors": [{k: v for k, v in entry.items() if v is not None}]})


def test_a_well_formed_error_passes():
    assert checks.problems(404, JSON, error(), (1, 39)) == []
    assert checks.problems(404, JSON, error(code=None), (1, 22)) == []
    assert checks.problems(406, JSON, error(406, code=None), None) == []
    assert checks.problems(200, {}, b"anything", (1, 39)) == []
    noauth2 = orjson.dumps({"message": "This server could not verify ...", "code": "401 Unauthorized",
                            "title": "Unauthorized"})
    assert checks.problems(401, JSON, noauth2, None) == []
    # The HTTP layer's own refusal of a head it cannot read (no Python ran).
    assert checks.problems(431, {"connection": "close"}, b"", None) == []
    assert checks.problems(414, {"connection": "close"}, b"", None) == []
    assert checks.problems(400, {"connection": "close"}, b"", None) == []


@pytest.mark.parametrize("status, headers, body, version, fragment", [
    (500, JSON, error(500), (1, 39), "a server error"),
    (503, {}, b"", None, "a server error"),
    (404, {"content-type": "text/html", "x-openstack-request-id": RID}, b"<html/>", None, "not JSON"),
    (404, {"content-type": "application/json"}, error(), None, "no request id header"),
    (404, JSON, b'{"error": "nope"}', None, "not in Placement's error format"),
    (404, JSON, error(status=400), None, "error status 400 in a 404 answer"),
    (404, JSON, error(request_id="req-other"), None, "not the header's"),
    (404, JSON, error(code=None), (1, 23), "no error code"),
    (404, JSON, error(title=None), None, "title missing"),
    (404, JSON, b'{"message": "m", "code": "401 Unauthorized", "title": "Unauthorized"}', None, "error format"),
    (431, {}, b"", None, "no request id header"),  # kept open: not the HTTP layer's refusal
    (404, {"connection": "close"}, b"", None, "no request id header"),
    (400, {"connection": "close", "content-type": "application/json"}, b"{}", None, "no request id header"),
])
def test_a_malformed_or_server_error_is_caught(status, headers, body, version, fragment):
    found = checks.problems(status, headers, body, version)
    assert any(fragment in problem for problem in found), found
