"""Policy defaults and enforcement.

The allow/deny table mirrors upstream Placement's functional RBAC tests
(``*-secure-rbac.yaml``: ``enforce_new_defaults = True``;
``*-legacy-rbac.yaml``: ``False``; scope always enforced) and the
``*-policy.yaml`` files (a policy file opening every rule but ``admin_api``).
"""

from __future__ import annotations

import dataclasses
import os
import itertools

import pytest
from oslo_config import cfg
from oslo_policy import opts as policy_opts
from oslo_policy import policy as oslo_policy

from allotment.api import policy
from allotment.domain import errors

PROJECT = "9520f97991e94f30a8dd205ef3ce735a"
PROJECT_ALT = "b2c1c1c2f8a54ad9a8a5b6f9d1c2e3f4"
ADMIN_PROJECT = "admin_project_id"
SERVICE_PROJECT = "service_project_id"


@dataclasses.dataclass
class Ctx:
    user_id: str | None = "user"
    project_id: str | None = None
    roles: list[str] = dataclasses.field(default_factory=list)
    system_scope: str | None = None
    is_admin: bool = False


# The personas of the RBAC gabbits (noauth2 token "user", X-Roles,
# X-Project-Id, OpenStack-System-Scope).
PERSONAS = {
    "admin": Ctx(project_id=ADMIN_PROJECT, roles=["admin"], is_admin=True),
    "service": Ctx(project_id=SERVICE_PROJECT, roles=["service"]),
    "system_admin": Ctx(roles=["admin", "member", "reader"], system_scope="all",
                        is_admin=True),
    "system_reader": Ctx(roles=["reader"], system_scope="all"),
    "project_admin": Ctx(project_id=PROJECT, roles=["admin", "member", "reader"],
                         is_admin=True),
    "project_member": Ctx(project_id=PROJECT, roles=["member", "reader"]),
    "project_reader": Ctx(project_id=PROJECT, roles=["reader"]),
    "alt_project_member": Ctx(project_id=PROJECT_ALT, roles=["member", "reader"]),
    "alt_project_reader": Ctx(project_id=PROJECT_ALT, roles=["reader"]),
    "no_roles": Ctx(project_id="user"),
}

# Every rule upstream 16.0.0 registers (the conformance harness's list of
# rules opened by OpenPolicyFixture, plus admin_api).
UPSTREAM_RULE_NAMES = {
    "admin_api",
    "admin_or_project_reader_or_service_api",
    "admin_or_service_api",
    "project_reader_api",
    "service_api",
    "placement:allocation_candidates:list",
    "placement:allocations:delete",
    "placement:allocations:list",
    "placement:allocations:manage",
    "placement:allocations:update",
    "placement:reshaper:reshape",
    "placement:resource_classes:create",
    "placement:resource_classes:delete",
    "placement:resource_classes:list",
    "placement:resource_classes:show",
    "placement:resource_classes:update",
    "placement:resource_providers:aggregates:list",
    "placement:resource_providers:aggregates:update",
    "placement:resource_providers:allocations:list",
    "placement:resource_providers:create",
    "placement:resource_providers:delete",
    "placement:resource_providers:inventories:create",
    "placement:resource_providers:inventories:delete",
    "placement:resource_providers:inventories:list",
    "placement:resource_providers:inventories:show",
    "placement:resource_providers:inventories:update",
    "placement:resource_providers:list",
    "placement:resource_providers:show",
    "placement:resource_providers:traits:delete",
    "placement:resource_providers:traits:list",
    "placement:resource_providers:traits:update",
    "placement:resource_providers:update",
    "placement:resource_providers:usages",
    "placement:traits:delete",
    "placement:traits:list",
    "placement:traits:show",
    "placement:traits:update",
    "placement:usages",
}

ADMIN_OR_SERVICE_RULES = sorted(
    name for name in UPSTREAM_RULE_NAMES
    if name.startswith("placement:")
    and name not in ("placement:reshaper:reshape", "placement:usages")
)


def make_conf(new_defaults: bool, policy_file: str | None = None) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    policy_opts.set_defaults(conf)  # registers [oslo_policy], as config.py does
    conf.set_override("enforce_new_defaults", new_defaults, group="oslo_policy")
    if policy_file is not None:
        conf.set_override("policy_file", policy_file, group="oslo_policy")
    return conf


def allowed(rule, persona, new_defaults, target=None, conf=None) -> bool:
    enforcer = policy.make_enforcer(conf or make_conf(new_defaults))
    try:
        policy.authorize(enforcer, PERSONAS[persona], rule, target)
    except errors.Forbidden:
        return False
    return True


# --- (rules, persona, enforce_new_defaults, target, expected) ---------------

SECURE_ADMIN_OR_SERVICE = {
    "admin": True,
    "service": True,
    "project_admin": True,
    "system_admin": False,
    "system_reader": False,
    "project_member": False,
    "project_reader": False,
}
LEGACY_ADMIN_OR_SERVICE = {
    "project_admin": True,
    "admin": True,
    "system_admin": False,
    "system_reader": False,
    "project_member": False,
    "project_reader": False,
}
SECURE_RESHAPE = {
    "service": True,
    "admin": False,
    "project_admin": False,
    "project_member": False,
    "project_reader": False,
    "system_admin": False,
    "system_reader": False,
}
LEGACY_RESHAPE = {
    "project_admin": True,
    "project_member": False,
    "system_admin": False,
}
USAGES_TARGET = {"project_id": PROJECT}
SECURE_TOTAL_USAGES = {
    "project_admin": True,
    "project_member": True,
    "project_reader": True,
    "admin": True,  # admin of another project
    "service": True,
    "alt_project_member": False,
    "alt_project_reader": False,
    "system_admin": False,
    "system_reader": False,
}
LEGACY_TOTAL_USAGES = {
    "project_admin": True,
    "alt_project_member": False,  # usage-legacy-rbac: member of another project
    "system_admin": False,
}

CASES = []
for rule, (persona, expected) in itertools.product(
        ADMIN_OR_SERVICE_RULES, SECURE_ADMIN_OR_SERVICE.items()):
    CASES.append((rule, persona, True, None, expected))
for rule, (persona, expected) in itertools.product(
        ADMIN_OR_SERVICE_RULES, LEGACY_ADMIN_OR_SERVICE.items()):
    CASES.append((rule, persona, False, None, expected))
for persona, expected in SECURE_RESHAPE.items():
    CASES.append(("placement:reshaper:reshape", persona, True, None, expected))
for persona, expected in LEGACY_RESHAPE.items():
    CASES.append(("placement:reshaper:reshape", persona, False, None, expected))
for persona, expected in SECURE_TOTAL_USAGES.items():
    CASES.append(("placement:usages", persona, True, USAGES_TARGET, expected))
for persona, expected in LEGACY_TOTAL_USAGES.items():
    CASES.append(("placement:usages", persona, False, USAGES_TARGET, expected))


@pytest.mark.parametrize(
    "rule,persona,new_defaults,target,expected", CASES,
    ids=[f"{c[0]}-{c[1]}-{'new' if c[2] else 'legacy'}" for c in CASES])
def test_rbac_table(rule, persona, new_defaults, target, expected):
    assert allowed(rule, persona, new_defaults, target) is expected


# --- Behaviour beyond the gabbits -------------------------------------------


def test_legacy_keeps_service_role():
    # The deprecated default is OR'd with the new one, so the service role
    # keeps working when enforce_new_defaults is False.
    assert allowed("placement:resource_providers:list", "service", False)
    assert allowed("placement:reshaper:reshape", "service", False)


def test_usages_default_target_is_own_project():
    assert allowed("placement:usages", "project_reader", True)
    assert not allowed("placement:resource_providers:usages", "project_reader", True)


def test_no_roles_denied():
    for new in (True, False):
        assert not allowed("placement:resource_providers:list", "no_roles", new)


def test_forbidden_message():
    enforcer = policy.make_enforcer(make_conf(True))
    with pytest.raises(errors.Forbidden) as info:
        policy.authorize(enforcer, PERSONAS["project_member"],
                         "placement:resource_providers:list")
    assert info.value.message == (
        "Policy does not allow placement:resource_providers:list to be performed.")
    assert info.value.status == 403


def test_scope_mismatch_is_forbidden_not_raised():
    enforcer = policy.make_enforcer(make_conf(True))
    with pytest.raises(errors.Forbidden):
        policy.authorize(enforcer, PERSONAS["system_admin"], "placement:traits:list")


def test_unregistered_rule_is_an_error():
    enforcer = policy.make_enforcer(make_conf(True))
    with pytest.raises(oslo_policy.PolicyNotRegistered):
        policy.authorize(enforcer, PERSONAS["admin"], "placement:nope")


# --- Rule definitions -------------------------------------------------------


def test_rule_names_match_upstream():
    names = [r.name for r in policy.DEFAULT_RULES]
    assert len(names) == len(set(names))
    assert set(names) == UPSTREAM_RULE_NAMES


def test_check_strings_and_scopes():
    rules = {r.name: r for r in policy.DEFAULT_RULES}
    assert rules["admin_api"].check_str == "role:admin"
    assert rules["service_api"].check_str == "role:service"
    assert rules["admin_or_service_api"].check_str == "role:admin or role:service"
    assert rules["project_reader_api"].check_str == (
        "role:reader and project_id:%(project_id)s")
    assert rules["project_reader_api"].scope_types is None
    assert rules["admin_or_project_reader_or_service_api"].check_str == (
        "role:admin or rule:project_reader_api or role:service")
    for name in ("service_api", "admin_or_service_api", "project_reader_api",
                 "admin_or_project_reader_or_service_api"):
        dep = rules[name].deprecated_rule
        assert dep.name == "rule:admin_api" and dep.check_str == "role:admin"
        assert dep.deprecated_since == "W"
    assert rules["admin_api"].deprecated_rule is None
    for name in ADMIN_OR_SERVICE_RULES:
        assert rules[name].check_str == "rule:admin_or_service_api", name
    assert rules["placement:reshaper:reshape"].check_str == "rule:service_api"
    assert rules["placement:usages"].check_str == (
        "rule:admin_or_project_reader_or_service_api")
    for rule in policy.DEFAULT_RULES:
        if rule.name.startswith("placement:"):
            assert isinstance(rule, oslo_policy.DocumentedRuleDefault)
            assert rule.scope_types == ["project"], rule.name
            assert rule.deprecated_rule is None, rule.name


# --- Policy files -----------------------------------------------------------


def write_open_policy(path):
    with open(path, "w") as f:
        for name in sorted(UPSTREAM_RULE_NAMES - {"admin_api"}):
            f.write(f'"{name}": "@"\n')


@pytest.mark.parametrize("new_defaults", [True, False])
def test_open_policy_file(tmp_path, new_defaults):
    path = tmp_path / "policy.yaml"
    write_open_policy(path)
    conf = make_conf(new_defaults, str(path))
    for rule in sorted(UPSTREAM_RULE_NAMES):
        if rule.startswith("placement:"):
            assert allowed(rule, "no_roles", new_defaults, conf=conf), rule
            assert allowed(rule, "project_reader", new_defaults, conf=conf), rule
    # '@' does not lift the scope check.
    assert not allowed("placement:traits:list", "system_reader", new_defaults,
                       conf=conf)


def test_missing_policy_file_uses_defaults(tmp_path):
    conf = make_conf(True, str(tmp_path / "does-not-exist.yaml"))
    assert allowed("placement:traits:list", "admin", True, conf=conf)
    assert not allowed("placement:traits:list", "no_roles", True, conf=conf)


def test_default_policy_file_on_unparsed_conf():
    # policy_file defaults to the relative "policy.yaml": no crash.
    conf = cfg.ConfigOpts()
    enforcer = policy.make_enforcer(conf)
    policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:list")


def test_parsed_config_file_relative_policy_file(tmp_path):
    (tmp_path / "placement.conf").write_text(
        "[oslo_policy]\n"
        "enforce_new_defaults = False\n"
        "enforce_scope = True\n"
        "policy_file = custom-policy.yaml\n")
    (tmp_path / "custom-policy.yaml").write_text(
        '"placement:traits:list": "role:member"\n')
    conf = cfg.ConfigOpts()
    conf(["--config-file", str(tmp_path / "placement.conf")])
    enforcer = policy.make_enforcer(conf)
    assert conf.oslo_policy.enforce_new_defaults is False
    policy.authorize(enforcer, PERSONAS["project_member"], "placement:traits:list")
    with pytest.raises(errors.Forbidden):
        policy.authorize(enforcer, PERSONAS["project_member"],
                         "placement:traits:show")
    # Legacy fallback still applies to rules not overridden.
    policy.authorize(enforcer, PERSONAS["project_admin"], "placement:traits:show")


def test_parsed_config_missing_relative_policy_file(tmp_path):
    (tmp_path / "placement.conf").write_text(
        "[oslo_policy]\npolicy_file = nowhere.yaml\n")
    conf = cfg.ConfigOpts()
    conf(["--config-file", str(tmp_path / "placement.conf")])
    enforcer = policy.make_enforcer(conf)
    policy.authorize(enforcer, PERSONAS["service"], "placement:reshaper:reshape")


def test_credentials_shape():
    creds = policy.credentials(PERSONAS["system_admin"])
    assert creds["system_scope"] == "all"
    assert creds["project_id"] is None
    assert creds["roles"] == ["admin", "member", "reader"]
    for key in ("user_id", "domain_id", "user_domain_id", "project_domain_id",
                "is_admin_project", "service_roles"):
        assert key in creds
    assert "is_admin" not in creds


# --- remembered decisions ----------------------------------------------------

def test_decisions_are_remembered_per_rule_target_and_caller(monkeypatch):
    enforcer = policy.make_enforcer(make_conf(True))
    checks = []
    real_enforce = oslo_policy.Enforcer.enforce

    def counting_enforce(self, rule, *args, **kwargs):
        checks.append(rule)
        return real_enforce(self, rule, *args, **kwargs)

    monkeypatch.setattr(oslo_policy.Enforcer, "enforce", counting_enforce)
    for _ in range(3):
        policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:list")
    assert checks == ["placement:traits:list"]
    # Another caller, rule or target is decided afresh, and decided right.
    with pytest.raises(errors.Forbidden):
        policy.authorize(enforcer, PERSONAS["project_reader"], "placement:traits:list")
    policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:show")
    policy.authorize(enforcer, PERSONAS["project_reader"], "placement:usages",
                     {"project_id": PROJECT})
    with pytest.raises(errors.Forbidden):
        policy.authorize(enforcer, PERSONAS["project_reader"], "placement:usages",
                         {"project_id": PROJECT_ALT})
    assert len(checks) == 5


def test_a_changed_policy_file_is_used_after_the_reload_interval(tmp_path, monkeypatch):
    path = tmp_path / "policy.yaml"
    path.write_text('"placement:traits:list": "role:admin"\n')
    enforcer = policy.make_enforcer(make_conf(True, str(path)))
    policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:list")
    clock = [policy.time.monotonic()]
    monkeypatch.setattr(policy.time, "monotonic", lambda: clock[0])
    policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:list")
    later = path.stat().st_mtime + 10  # a newer mtime, whatever the file system's resolution
    path.write_text('"placement:traits:list": "role:member"\n')
    os.utime(path, (later, later))
    # Within the interval the rules in force stay in force...
    clock[0] += policy.RELOAD_INTERVAL / 2
    policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:list")
    # ...after it the new file decides, and nothing remembered from before counts.
    clock[0] += policy.RELOAD_INTERVAL
    with pytest.raises(errors.Forbidden):
        policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:list")
    policy.authorize(enforcer, PERSONAS["project_member"], "placement:traits:list")


def test_set_rules_drops_remembered_decisions():
    enforcer = policy.make_enforcer(make_conf(True))
    policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:list")
    enforcer.set_rules(oslo_policy.Rules.from_dict({"placement:traits:list": "!"}), overwrite=False)
    with pytest.raises(errors.Forbidden):
        policy.authorize(enforcer, PERSONAS["admin"], "placement:traits:list")
