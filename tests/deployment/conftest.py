"""Allotment as a deployment tool installs it: wheels built from a clean
clone, installed (not editable) with uwsgi into a fresh venv made with
Debian's /usr/bin/python3 (the interpreter Debian's mod_wsgi is built
for), then served by what the tools run: ``allotment serve`` (the systemd
unit), uwsgi and Apache httpd + mod_wsgi.

The venv is built once per test session and shared by the xdist workers.
These tests run in one backend's pass only (MariaDB's, Kolla's database;
``ALLOTMENT_DEPLOYMENT_BACKEND`` picks another).  What they need and a
machine may lack (git, Debian's python3 with venv, the index, Apache and
mod_wsgi, which ``scripts/test`` installs with apt-get when root) makes
them skip with the reason, and fail under ``CI=true``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import BACKEND

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
DEPLOYMENT_BACKEND = os.environ.get("ALLOTMENT_DEPLOYMENT_BACKEND", "mysql")
IN_CI = os.environ.get("CI") == "true"


def missing(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: nothing may be missing)")
    pytest.skip(reason)


def pytest_collection_modifyitems(config, items):
    if BACKEND == DEPLOYMENT_BACKEND:
        return
    skip = pytest.mark.skip(reason=f"deployment tests run in the {DEPLOYMENT_BACKEND} pass only")
    for item in items:
        if "tests/deployment/" in str(item.fspath):
            item.add_marker(skip)


@dataclass
class Installed:
    venv: Path
    dist: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return done


def _build(into: Path) -> None:
    """Both distributions, from a clone of the committed tree (what a release builds)."""
    clone = into / "clone"
    _run(["git", "clone", "--quiet", "--no-local", str(REPO), str(clone)])
    dist = into / "dist"
    for project in (clone, clone / "compat" / "placement-wsgi"):
        _run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(project)])
    venv = into / "venv"
    _run([SYSTEM_PYTHON, "-m", "venv", str(venv)])
    wheels = sorted(str(path) for path in dist.glob("*.whl"))
    # --use-pep517: uwsgi (an sdist) is built as a wheel, which pip keeps in its cache.
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--use-pep517", *wheels, "uwsgi"],
         timeout=1200)
    (into / "ready").write_text(json.dumps({"venv": str(venv), "dist": str(dist)}))


def _shared_directory() -> Path:
    """One directory for every xdist worker of this run, outside pytest's
    numbered temp directories (which other pytest runs on the machine prune
    while this one may still be using them); tests/conftest.py names the
    run and removes it when the run ends."""
    return Path(tempfile.gettempdir()) / f"allotment-deployment-{os.environ['ALLOTMENT_TEST_RUN']}"


@pytest.fixture(scope="session")
def installed() -> Installed:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        missing("not a git checkout with git installed: the wheels are built from a clean clone")
    if not os.access(SYSTEM_PYTHON, os.X_OK) or subprocess.run(
            [SYSTEM_PYTHON, "-c", "import ensurepip, venv"], capture_output=True).returncode:
        missing(f"{SYSTEM_PYTHON} with venv (Debian's python3-venv) is needed")
    try:
        import build  # noqa: F401
    except ImportError:
        missing("the 'build' package (pip install -e '.[test]') is needed")
    shared = _shared_directory()
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder among the xdist workers
        if not (shared / "ready").exists():
            _build(shared)
    found = json.loads((shared / "ready").read_text())
    return Installed(Path(found["venv"]), Path(found["dist"]))


@pytest.fixture(scope="session")
def apache():
    if not os.access("/usr/sbin/apache2", os.X_OK) or not os.path.exists("/usr/lib/apache2/modules/mod_wsgi.so"):
        missing("Apache httpd and mod_wsgi are needed: apt-get install apache2 libapache2-mod-wsgi-py3")
    return "/usr/sbin/apache2"
