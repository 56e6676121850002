"""The direct interface (``allotment.direct.Direct``) and ``allotment reshape``.

Direct drives the same WSGI application as the server, in-process: these
tests check that it really is the same application (validation,
microversions, policy), that it builds and migrates its own database, that
it leaves the caller's configuration alone, and that the worked example of
docs/direct.md runs as written.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from allotment import cli, config
from allotment.db import tables
from allotment.db.engine import utcnow
from allotment.direct import Direct
from tests.conftest import BACKEND, create_database, make_conf, new_uuid

DIRECT_DOC = Path(__file__).resolve().parents[2] / "docs" / "direct.md"
DOC_CONFIG = "/etc/placement/placement.conf"


def write_config(path: Path, db_url: str, **sections: dict) -> Path:
    lines = ["[placement_database]", f"connection = {db_url}"]
    for name, options in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {value}" for key, value in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def conf(app, db_url):
    """A populated ConfigOpts for the (emptied) test database."""
    return make_conf(db_url)


@pytest.fixture
def fresh_db(tmp_path_factory):
    url, drop = create_database(tmp_path_factory, "direct")
    yield url
    drop()


def insert_provider(app_or_engine, generation: int = 0) -> str:
    engine = getattr(app_or_engine, "engine", app_or_engine)
    uuid = new_uuid()
    rp = tables.resource_providers
    with engine.begin() as conn:
        pid = conn.execute(sa.insert(rp).values(uuid=uuid, name=f"rp-{uuid}", generation=generation,
                                                created_at=utcnow())).inserted_primary_key[0]
        conn.execute(sa.update(rp).where(rp.c.id == pid).values(root_provider_id=pid))
    return uuid


# -- the client ---------------------------------------------------------------


def test_config_file_path_and_a_fresh_database_are_migrated(tmp_path, fresh_db):
    path = write_config(tmp_path / "placement.conf", fresh_db)
    with Direct(str(path)) as client:
        r = client.get("/resource_classes")
    assert r.status_code == 200
    assert "VCPU" in [rc["name"] for rc in r.json()["resource_classes"]]


def test_answers_are_requests_responses(conf):
    with Direct(conf) as client:
        assert isinstance(client, requests.Session)
        r = client.get("/resource_classes/VCPU")
        assert isinstance(r, requests.Response)
        assert r.ok and r.status_code == 200 and r.reason == "OK"
        assert r.json() == {"name": "VCPU", "links": [{"rel": "self", "href": "/resource_classes/VCPU"}]}
        assert r.headers["content-type"] == "application/json"
        assert r.headers["X-OpenStack-Request-Id"].startswith("req-")
        assert r.url == "http://allotment.direct/resource_classes/VCPU"
        # Full URLs on the fake origin work too; query strings reach the app.
        r = client.get("http://allotment.direct/traits", params={"name": "startswith:HW_CPU_X86_AVX"})
        assert r.status_code == 200
        assert r.json()["traits"] and all(t.startswith("HW_CPU_X86_AVX") for t in r.json()["traits"])


def test_writes_and_errors_go_through_the_api(conf):
    with Direct(conf) as client:
        created = client.post("/resource_classes", json={"name": "CUSTOM_DIRECT"})
        assert created.status_code == 201
        assert created.headers["location"].endswith("/resource_classes/CUSTOM_DIRECT")
        duplicate = client.post("/resource_classes", json={"name": "CUSTOM_DIRECT"})
        assert duplicate.status_code == 409
        invalid = client.post("/resource_classes", json={"name": "lower"})
        assert invalid.status_code == 400
        assert "JSON does not validate" in invalid.json()["errors"][0]["detail"]
        malformed = client.post("/resource_classes", data=b"{", headers={"Content-Type": "application/json"})
        assert malformed.status_code == 400
        assert "Malformed JSON" in malformed.text
        wrong_type = client.post("/resource_classes", data=b"{}", headers={"Content-Type": "text/plain"})
        assert wrong_type.status_code == 415
        assert client.get("/nothing/here").status_code == 404
        assert client.delete("/resource_classes/CUSTOM_DIRECT").status_code == 204


def test_microversion_latest_by_default_settable_per_client_and_per_request(conf):
    with Direct(conf) as client:
        assert client.get("/").headers["openstack-api-version"] == "placement 1.39"
        r = client.get("/resource_classes/VCPU", microversion="1.1")
        assert r.status_code == 404  # resource classes appear in 1.2
        assert r.headers["openstack-api-version"] == "placement 1.1"
        r = client.get("/resource_classes/VCPU", headers={"OpenStack-API-Version": "placement 1.2"})
        assert r.headers["openstack-api-version"] == "placement 1.2"
        assert client.get("/", microversion="2.0").status_code == 406
    with Direct(conf, microversion="1.14") as client:
        assert client.get("/").headers["openstack-api-version"] == "placement 1.14"


def test_leaves_the_callers_configuration_alone(tmp_path, db_url, app):
    """The file says keystone; Direct runs noauth2 without touching the options."""
    path = write_config(tmp_path / "placement.conf", db_url, api={"auth_strategy": "keystone"})
    conf = config.load(str(path))
    with Direct(conf) as client:
        assert client.get("/resource_classes/VCPU").status_code == 200
    assert conf.api.auth_strategy == "keystone"


def test_policy_is_enforced(conf):
    with Direct(conf) as client:
        # The default identity: admin and service roles.
        assert client.get("/resource_classes").status_code == 200
        # Another identity, per request.
        r = client.get("/resource_classes", headers={"X-Auth-Token": "someone", "X-Roles": "member"})
        assert r.status_code == 403
        assert "placement:resource_classes:list" in r.json()["errors"][0]["detail"]
    with Direct(conf, token="someone", roles=("reader",)) as client:
        assert client.get("/resource_classes").status_code == 403


def test_a_policy_file_binds_the_direct_interface_too(tmp_path, conf):
    policy = tmp_path / "policy.yaml"
    policy.write_text('"placement:resource_classes:list": "!"\n')
    conf.set_override("policy_file", str(policy), group="oslo_policy")
    with Direct(conf) as client:
        assert client.get("/resource_classes").status_code == 403
        assert client.get("/resource_classes/VCPU").status_code == 200


@pytest.mark.skipif(BACKEND != "sqlite", reason="only a file database needs no socket at all")
def test_no_socket_is_opened(tmp_path, fresh_db, monkeypatch):
    path = write_config(tmp_path / "placement.conf", fresh_db)

    def refuse(*args, **kwargs):
        raise AssertionError("the direct interface opened a socket")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    with Direct(str(path)) as client:
        assert client.post("/resource_classes", json={"name": "CUSTOM_OFFLINE"}).status_code == 201
        assert client.get("/resource_classes/CUSTOM_OFFLINE").status_code == 200


def test_threads_may_share_a_client(conf):
    from concurrent.futures import ThreadPoolExecutor

    with Direct(conf) as client:
        names = [f"CUSTOM_T{i}" for i in range(12)]
        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(lambda n: client.put(f"/resource_classes/{n}").status_code, names))
        assert statuses == [201] * len(names)


# -- the worked example of docs/direct.md --------------------------------------


def doc_example() -> str:
    """The Python block of docs/direct.md (the page holds one)."""
    blocks = re.findall(r"```python\n(.*?)```", DIRECT_DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/direct.md should hold one Python example"
    return blocks[0]


def test_doc_example_runs_as_written(tmp_path, fresh_db, capsys):
    code = doc_example()
    assert DOC_CONFIG in code
    path = write_config(tmp_path / "placement.conf", fresh_db)
    exec(compile(code.replace(DOC_CONFIG, str(path)), "docs/direct.md", "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out
    # What the page says it prints.
    assert printed.splitlines() == ["compute node usages: {'MEMORY_MB': 4096, 'VCPU': 4}",
                                    "gpu0 usages: {'VGPU': 2}",
                                    "gpu1 usages: {'VGPU': 2}"]
    assert printed in DIRECT_DOC.read_text()
    # And the tree is as the section describes: VGPU on the children only,
    # each instance's VGPU on its own GPU, the rest on the node.
    with Direct(str(path)) as client:
        providers = client.get("/resource_providers", microversion="1.14").json()["resource_providers"]
        by_name = {p["name"]: p for p in providers}
        node = by_name["compute-1"]["uuid"]
        gpus = [by_name[f"compute-1_gpu{i}"]["uuid"] for i in range(2)]
        assert all(by_name[f"compute-1_gpu{i}"]["parent_provider_uuid"] == node for i in range(2))
        assert set(client.get(f"/resource_providers/{node}/inventories").json()["inventories"]) == {
            "VCPU", "MEMORY_MB"}
        holders = client.get(f"/resource_providers/{node}/allocations").json()["allocations"]
        assert len(holders) == 2
        on_gpus = set()
        for consumer in holders:
            shown = client.get(f"/allocations/{consumer}").json()
            assert shown["consumer_generation"] == 2 and shown["consumer_type"] == "INSTANCE"
            assert shown["allocations"][node]["resources"] == {"VCPU": 2, "MEMORY_MB": 2048}
            (gpu,) = set(shown["allocations"]) - {node}
            assert shown["allocations"][gpu]["resources"] == {"VGPU": 2}
            on_gpus.add(gpu)
        assert on_gpus == set(gpus)


# -- allotment reshape ------------------------------------------------------------


@pytest.fixture
def conf_file(tmp_path, db_url, app):
    return write_config(tmp_path / "placement.conf", db_url)


def _payload(tmp_path: Path, provider: str, generation: int) -> Path:
    path = tmp_path / "payload.json"
    path.write_text(json.dumps({
        "inventories": {provider: {"resource_provider_generation": generation,
                                   "inventories": {"DISK_GB": {"total": 100}}}},
        "allocations": {}}))
    return path


def test_reshape_command_applies_a_payload(tmp_path, app, conf_file, capsys):
    provider = insert_provider(app.db)
    payload = _payload(tmp_path, provider, 0)
    assert cli.main(["reshape", "--config-file", str(conf_file), str(payload)]) == 0
    assert "204 No Content: reshape applied" in capsys.readouterr().out
    with Direct(str(conf_file)) as client:
        shown = client.get(f"/resource_providers/{provider}/inventories").json()
    assert shown["inventories"]["DISK_GB"]["total"] == 100


def test_reshape_command_reports_a_refusal(tmp_path, app, conf_file, capsys):
    provider = insert_provider(app.db, generation=4)
    payload = _payload(tmp_path, provider, 3)
    assert cli.main(["reshape", "--config-file", str(conf_file), str(payload)]) == 1
    err = capsys.readouterr().err
    assert "409 Conflict: reshape refused" in err
    assert (f"placement.concurrent_update: resource provider generation conflict for provider {provider}: "
            "actual: 4, given: 3") in err


def test_reshape_command_microversion(tmp_path, app, conf_file, capsys):
    provider = insert_provider(app.db)
    payload = _payload(tmp_path, provider, 0)
    assert cli.main(["reshape", "--config-file", str(conf_file), "--microversion", "1.29", str(payload)]) == 1
    assert "404 Not Found" in capsys.readouterr().err


def test_reshape_command_schema_errors_in_one_line(tmp_path, conf_file, capsys):
    payload = tmp_path / "payload.json"
    payload.write_text('{"inventories": {}}')
    assert cli.main(["reshape", "--config-file", str(conf_file), str(payload)]) == 1
    # (Other lines may come from logging handlers earlier tests installed.)
    err = capsys.readouterr().err
    # Of the body's two faults, the one Placement reports (jsonschema's best match).
    assert ("400 Bad Request: reshape refused\n"
            "  placement.undefined_code: JSON does not validate: 'allocations' is a required property\n") in err


@pytest.mark.parametrize("content", [None, "{not json"])
def test_reshape_command_unreadable_payload(tmp_path, conf_file, capsys, content):
    payload = tmp_path / "payload.json"
    if content is not None:
        payload.write_text(content)
    assert cli.main(["reshape", "--config-file", str(conf_file), str(payload)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_reshape_command_needs_a_configured_database(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OS_PLACEMENT_CONFIG_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setattr(config, "DEFAULT_CONFIG_DIR", str(tmp_path / "nowhere"))
    payload = tmp_path / "payload.json"
    payload.write_text("{}")
    assert cli.main(["reshape", str(payload)]) == 2
    assert "configuration error" in capsys.readouterr().err
