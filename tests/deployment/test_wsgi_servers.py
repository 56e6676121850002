"""uwsgi and Apache httpd + mod_wsgi serving Allotment with the example
files a deployment tool would write (``etc/uwsgi/placement-api.ini``,
``etc/apache/placement-api.conf``): Placement's import path
``placement.wsgi.api`` and WSGI script ``placement-api`` from the
opt-in ``allotment-placement-wsgi`` wheel, started as ``serve.py`` starts
them (``placement-manage db sync`` first, as Kolla's bootstrap).

Each answers a write carrying a global request id, which its log file
shows in oslo's form, and a slice of the upstream conformance suite.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import requests

from tests.deployment.conftest import REPO, missing
from tests.functional.test_server import LiveServer, clean_env, free_port, fresh_db, write_config  # noqa: F401

SERVE = Path(__file__).with_name("serve.py")
#: Files of the upstream suite run through each server, and how many tests they hold.
SLICE = ["basic-http.yaml", "resource-provider.yaml", "allocations-1.28.yaml", "cors.yaml"]
SLICE_TESTS = 135


def _start(server: str, installed, config: Path) -> LiveServer:
    port = free_port()
    command = [sys.executable, str(SERVE), server, str(installed.venv), "--config-file", str(config),
               "--port", str(port)]
    live = LiveServer(command, port, config.parent / f"{server}.log", env=clean_env())
    live.wait_ready(timeout=120)
    return live


@pytest.fixture
def config_home():
    """A directory Apache's WSGI daemon (nobody) can reach: pytest's own
    temporary directories are closed to other users."""
    directory = Path(tempfile.mkdtemp(prefix="allotment-wsgi-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("server", ["uwsgi", "apache"])
def test_a_write_with_a_global_request_id_reaches_the_log_file(server, installed, fresh_db,  # noqa: F811
                                                               config_home, request):
    if server == "apache":
        request.getfixturevalue("apache")
    log_file = config_home / "etc" / "placement-api.log"
    config = write_config(config_home / "etc", fresh_db, extra=f"[DEFAULT]\nlog_file = {log_file}\n")
    live = _start(server, installed, config)
    global_id = f"req-{uuid.uuid4()}"
    try:
        resp = requests.post(live.url + "/resource_providers", json={"name": f"{server}-rp"}, timeout=30,
                             headers={"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.20",
                                      "X-OpenStack-Request-ID": global_id})
        assert resp.status_code == 200, resp.text
        local_id = resp.headers["x-openstack-request-id"]
    finally:
        live.stop()
    lines = [line for line in log_file.read_text().splitlines() if local_id in line]
    assert len(lines) == 1, live.log()
    assert re.search(rf"INFO placement.requestlog \[{global_id} {local_id} admin admin - - - -\] \S+ "
                     r'"POST /resource_providers" status: 200 ', lines[0]), lines[0]


@pytest.mark.parametrize("server", ["uwsgi", "apache"])
def test_conformance_slice(server, installed, tmp_path, request):
    if server == "apache":
        request.getfixturevalue("apache")
    found = subprocess.run([sys.executable, str(REPO / "tools" / "conformance"), "--find-runner"],
                           capture_output=True, text=True)
    if found.returncode:
        missing("the conformance runner (../shared/conformance/run) is not on this machine")
    report = tmp_path / "report.json"
    serve = " ".join(shlex.quote(part) for part in (sys.executable, str(SERVE), server, str(installed.venv)))
    command = [found.stdout.strip(), "--serve", serve + " --config-file {config} --port {port}",
               "--jobs", "2", "--json", str(report)]
    for name in SLICE:
        command += ["--only", name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=clean_env())
    summary = json.loads(report.read_text())["summary"] if report.exists() else {}
    assert (summary.get("passed"), summary.get("failed")) == (SLICE_TESTS, 0), done.stdout[-4000:]
