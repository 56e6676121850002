"""The wheel and sdist a release ships, installed (not editable) and run."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
import zipfile
from pathlib import Path

import requests

from tests.deployment.conftest import REPO
from tests.functional.test_server import LiveServer, clean_env, free_port, fresh_db, write_config  # noqa: F401

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
UNIT = REPO / "etc" / "systemd" / "allotment.service"


def test_the_distributions_carry_one_version_and_the_main_one_no_placement_package(installed):
    names = sorted(path.name for path in installed.dist.iterdir())
    assert names == [f"allotment-{VERSION}-py3-none-any.whl", f"allotment-{VERSION}.tar.gz",
                     f"allotment_placement_wsgi-{VERSION}-py3-none-any.whl",
                     f"allotment_placement_wsgi-{VERSION}.tar.gz"]
    with zipfile.ZipFile(installed.dist / f"allotment-{VERSION}-py3-none-any.whl") as wheel:
        files = wheel.namelist()
        entry_points = wheel.read(f"allotment-{VERSION}.dist-info/entry_points.txt").decode()
    assert not [name for name in files if name.startswith("placement/")], "the main wheel must not shadow Placement"
    assert "allotment/db/migrations/versions/0001_initial.py" in files or any(
        re.match(r"allotment/db/migrations/versions/\w+\.py", name) for name in files)
    for line in ("placement-manage = allotment.cli.manage:main", "placement-status = allotment.cli.upgrade_check:main",
                 "placement.conf = allotment.config:list_opts", "placement = allotment.api.policy:list_rules",
                 "placement = allotment.api.policy:get_enforcer"):
        assert line in entry_points
    with zipfile.ZipFile(installed.dist / f"allotment_placement_wsgi-{VERSION}-py3-none-any.whl") as wheel:
        metadata = wheel.read(f"allotment_placement_wsgi-{VERSION}.dist-info/METADATA").decode()
        assert "placement/wsgi/api.py" in wheel.namelist()
    assert f"Requires-Dist: allotment=={VERSION}" in metadata


def test_installed_from_the_wheel_and_every_command_says_its_version(installed, tmp_path):
    where = subprocess.run([installed.bin("python"), "-c", "import allotment; print(allotment.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(installed.venv / "lib")), where  # not the checkout: not editable
    for command in ("allotment", "placement-manage", "placement-status"):
        said = subprocess.run([installed.bin(command), "--version"], capture_output=True, text=True)
        assert said.returncode == 0 and said.stdout.split()[-1] == VERSION, (command, said)


def _unit() -> tuple[list[str], dict[str, str]]:
    """ExecStart and Environment= of the example unit."""
    command, env = None, {}
    for line in UNIT.read_text().splitlines():
        if line.startswith("ExecStart="):
            command = shlex.split(line.removeprefix("ExecStart="))
        elif line.startswith("Environment="):
            key, _, value = line.removeprefix("Environment=").partition("=")
            env[key] = value
    assert command and env
    return command, env


def test_the_systemd_units_command_serves_from_the_installed_venv(installed, fresh_db, tmp_path):  # noqa: F811
    command, env = _unit()
    assert env == {"OS_PLACEMENT_CONFIG_DIR": "/etc/placement"}
    config = write_config(tmp_path / "etc", fresh_db)
    port = free_port()
    # The unit as written, but for the venv, the configuration directory and the address.
    command = [part.replace("/opt/allotment/venv", str(installed.venv)) for part in command]
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    live = LiveServer(command, port, tmp_path / "unit.log", env=clean_env(OS_PLACEMENT_CONFIG_DIR=str(config.parent)))
    try:
        live.wait_ready(timeout=120)
        resp = requests.post(live.url + "/resource_providers", json={"name": "from-the-wheel"},
                             headers={"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.20"},
                             timeout=30)
        assert resp.status_code == 200, resp.text
    finally:
        live.stop()
