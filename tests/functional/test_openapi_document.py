"""``GET /allotment/openapi.json`` and ``allotment openapi``: the API's description.

Public like ``GET /`` (it describes the software, not the deployment), in
Allotment's own URL space, one document per microversion.
"""

from __future__ import annotations

import json

from allotment import cli
from allotment.api import openapi
from allotment.api.routes import TABLE
from allotment.api.microversion import MAX_VERSION, Version


def test_served_without_a_token(api):
    response = api.get("/allotment/openapi.json", token="")
    assert response.status == 200, response
    assert response.headers["Content-Type"] == "application/json"
    assert response.json == openapi.document(TABLE, MAX_VERSION)


def test_one_document_per_microversion(api):
    response = api.get("/allotment/openapi.json?microversion=1.10")
    assert response.status == 200, response
    assert response.json["info"]["version"] == "1.10"
    assert "/allocation_candidates" in response.json["paths"]
    assert "/usages" in response.json["paths"]
    assert "/reshaper" not in response.json["paths"]
    assert api.get("/allotment/openapi.json?microversion=latest").json["info"]["version"] == str(MAX_VERSION)


def test_unserved_or_malformed_microversions_are_400(api):
    for query, fragment in (("microversion=1.40", "microversion 1.40 is not served (1.0 to 1.39)"),
                            ("microversion=2.0", "microversion 2.0 is not served"),
                            ("microversion=one", "does not match"),
                            ("format=yaml", "Additional properties are not allowed")):
        response = api.get(f"/allotment/openapi.json?{query}", token="")
        assert response.status == 400, response
        error = response.error()
        assert fragment in error["detail"]
        assert error["request_id"] == response.headers["x-openstack-request-id"]


def test_other_methods_are_405(api):
    response = api.post("/allotment/openapi.json", json={})
    assert response.status == 405, response
    assert response.headers["Allow"] == "GET"


def test_other_paths_of_our_own_are_404(api):
    assert api.get("/allotment/openapi.yaml").status == 404
    assert api.get("/allotment").status == 404


def test_the_command_writes_the_served_document(api, capsys, tmp_path):
    assert cli.main(["openapi", "--microversion", "1.20"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written == api.get("/allotment/openapi.json?microversion=1.20").json
    assert written == openapi.document(TABLE, Version(1, 20))
    target = tmp_path / "openapi.json"
    assert cli.main(["openapi", "-o", str(target)]) == 0
    assert json.loads(target.read_text())["info"]["version"] == str(MAX_VERSION)


def test_the_command_refuses_an_unserved_microversion(capsys):
    assert cli.main(["openapi", "--microversion", "1.99"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == "allotment openapi: microversion 1.99 is not served (1.0 to 1.39)"
    assert captured.out == ""
