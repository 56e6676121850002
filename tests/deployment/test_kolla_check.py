"""``tools/kolla-check`` on the venv made from the wheels: every step of a
Kolla-shaped deployment on MariaDB passes (the same check passes on the
reference Placement: ``tools/kolla-check reference``)."""

from __future__ import annotations

import subprocess
import sys

from tests.deployment.conftest import REPO
from tests.functional.test_server import clean_env


def test_a_kolla_shaped_deployment_passes_every_step(installed, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "tools" / "kolla-check"), "--venv", str(installed.venv)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(steps) == 9 and all(line.startswith("PASS") for line in steps), done.stdout
