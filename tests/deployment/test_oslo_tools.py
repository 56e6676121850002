"""oslo's command-line tools find Allotment through the installed wheel's
entry points and give what they give for Placement.

``oslo-config-generator --namespace placement.conf`` must list the same
groups and options with the same defaults, and
``oslopolicy-sample-generator --namespace placement`` the same rule names,
check strings, scope types and operations, as the reference's own
(``openstack-placement`` 16.0.0, run from its venv); only the help texts,
our own words, differ.  ``oslopolicy-checker`` (with Placement's enforcer)
and ``oslopolicy-policy-upgrade`` must print exactly the same.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests import reference
from tests.deployment.conftest import missing


@pytest.fixture(scope="module")
def reference_bin():
    venv = reference.ensure_venv()
    if venv is None:
        missing("the reference Placement's venv (shared/reference/serve builds it) is needed to compare")
    return Path(venv) / "bin"


def _tool(bin_dir: Path, name: str, *args: str, cwd: Path) -> str:
    done = subprocess.run([str(bin_dir / name), *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "HOME": str(cwd)})  # no ~/.placement: the same files for both
    assert done.returncode == 0, (name, done.stderr[-2000:])
    return done.stdout


def _facts(sample: str, pattern: str) -> list[str]:
    """The lines of a generated sample that are facts (names, values), not help text."""
    return [line for line in sample.splitlines() if re.match(pattern, line)]


CONFIG_FACTS = r"^(\[\w+\]|#?\w+ = .*|# (Minimum|Maximum) value: .*|# Deprecated group/name - .*)$"
POLICY_FACTS = r'^(#?"[^"]+": ".*"|# Intended scope\(s\): .*|# (GET|PUT|POST|DELETE|PATCH|HEAD)\s+/.*)$'


def test_config_generator_lists_placements_options(installed, reference_bin, tmp_path):
    ours = _tool(installed.venv / "bin", "oslo-config-generator", "--namespace", "placement.conf", cwd=tmp_path)
    theirs = _tool(reference_bin, "oslo-config-generator", "--namespace", "placement.conf", cwd=tmp_path)
    ours_facts, their_facts = _facts(ours, CONFIG_FACTS), _facts(theirs, CONFIG_FACTS)
    names = lambda facts: [line for line in facts if " = " in line or line.startswith("[")]  # noqa: E731
    assert names(ours_facts) == names(their_facts)
    assert len(names(ours_facts)) > 20
    # Stricter than the reference: bounds on values it accepts but cannot use.
    assert set(their_facts) <= set(ours_facts)


def test_policy_sample_has_placements_rules(installed, reference_bin, tmp_path):
    ours = _tool(installed.venv / "bin", "oslopolicy-sample-generator", "--namespace", "placement", cwd=tmp_path)
    theirs = _tool(reference_bin, "oslopolicy-sample-generator", "--namespace", "placement", cwd=tmp_path)
    assert _facts(ours, POLICY_FACTS) == _facts(theirs, POLICY_FACTS)
    assert len(_facts(ours, POLICY_FACTS)) > 100


def test_policy_checker_and_upgrade_print_the_same(installed, reference_bin, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text('"placement:resource_providers:list": "role:reader"\n'
                      '"placement:usages": "rule:admin_api"\n'
                      '"admin_or_service_api": "role:admin or role:service or role:operator"\n')
    access = tmp_path / "access.json"
    access.write_text(json.dumps({"token": {
        "methods": ["password"], "expires_at": "2030-01-01T00:00:00.000000Z",
        "roles": [{"id": "r1", "name": "reader"}, {"id": "r2", "name": "operator"}],
        "project": {"id": "p1", "name": "demo", "domain": {"id": "default", "name": "Default"}},
        "user": {"id": "u1", "name": "demo", "domain": {"id": "default", "name": "Default"}}}}))
    enforcer = tmp_path / "enforcer.conf"
    enforcer.write_text("[DEFAULT]\nnamespace = placement\n")
    checker = ["--policy", str(policy), "--access", str(access), "--enforcer_config", str(enforcer)]
    ours = _tool(installed.venv / "bin", "oslopolicy-checker", *checker, cwd=tmp_path)
    assert ours == _tool(reference_bin, "oslopolicy-checker", *checker, cwd=tmp_path)
    assert "passed: placement:resource_providers:list" in ours
    upgrade = ["--namespace", "placement", "--policy", str(policy)]
    ours = _tool(installed.venv / "bin", "oslopolicy-policy-upgrade", *upgrade, cwd=tmp_path)
    assert ours == _tool(reference_bin, "oslopolicy-policy-upgrade", *upgrade, cwd=tmp_path)
