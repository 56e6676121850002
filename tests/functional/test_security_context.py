"""The caller's security context is Placement's: every identity header it
reads, read as it reads them, and the same 401s.

The expected statuses are what the reference Placement (16.0.0, noauth2,
the same policy file) answered to the same requests; where Allotment
answered differently before, the case says so.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import ApiClient, make_conf, new_uuid

POLICY = {
    "placement:resource_providers:list": "is_admin_project:True",
    "placement:resource_classes:list": "service_roles:service",
    "placement:traits:list": "service_user_id:svc",
    "placement:resource_classes:show": "user_domain_id:ud",
    "placement:traits:show": "project_domain_id:pd",
    "placement:resource_providers:show": "service_user_domain_id:sud",
    "placement:resource_providers:aggregates:list": "service_project_domain_id:spd",
    "placement:resource_providers:usages": "role:admin",
    "placement:resource_providers:inventories:list": "user_id:alice",
}


@pytest.fixture
def guarded(db_url, tmp_path):
    """The application under POLICY, and a provider to ask about."""
    from allotment.api.app import Application
    from allotment.service import database_from_config
    from tests.conftest import _empty_tables

    path = tmp_path / "policy.yaml"
    path.write_text("".join(f'"{rule}": "{check}"\n' for rule, check in POLICY.items()))
    conf = make_conf(db_url, oslo_policy__policy_file=str(path))
    application = Application(conf, database_from_config(conf))
    _empty_tables(application.db.engine)
    uuid = new_uuid()
    assert ApiClient(application).post("/resource_providers", json={"name": "rp", "uuid": uuid}).status == 200
    yield ApiClient(application, token="bob"), uuid
    application.db.dispose()


# (path, headers, the reference's status); {rp} is the provider's uuid.
CASES = [
    # is_admin_project: true unless the header says otherwise (Allotment: always true).
    ("/resource_providers", {"X-Auth-Token": "admin"}, 200),
    ("/resource_providers", {"X-Auth-Token": "admin", "X-Is-Admin-Project": "True"}, 200),
    ("/resource_providers", {"X-Auth-Token": "admin", "X-Is-Admin-Project": "false"}, 403),
    ("/resource_providers", {"X-Auth-Token": "admin", "X-Is-Admin-Project": "yes"}, 403),
    ("/resource_providers", {"X-Auth-Token": "admin", "X-Is-Admin-Project": ""}, 403),
    # X-Service-Roles (Allotment: never read).
    ("/resource_classes", {}, 403),
    ("/resource_classes", {"X-Service-Roles": "reader, service"}, 200),
    ("/resource_classes", {"X-Service-Roles": "service,"}, 200),
    ("/resource_classes", {"X-Service-Roles": "Service"}, 403),
    ("/resource_classes", {"X-Service-Roles": ""}, 403),
    ("/resource_classes", {"X-Roles": "service"}, 403),
    # The service token's user and projects (Allotment: never read).
    ("/traits", {"X-Service-User-Id": "svc"}, 200),
    ("/traits", {}, 403),
    ("/resource_providers/{rp}", {"X-Service-User-Domain-Id": "sud"}, 200),
    ("/resource_providers/{rp}", {}, 403),
    ("/resource_providers/{rp}/aggregates", {"X-Service-Project-Domain-Id": "spd"}, 200),
    ("/resource_providers/{rp}/aggregates", {}, 403),
    # The user's and project's domains.
    ("/resource_classes/VCPU", {"X-User-Domain-Id": "ud"}, 200),
    ("/resource_classes/VCPU", {}, 403),
    ("/traits/HW_CPU_X86_AVX", {"X-Project-Domain-Id": "pd"}, 204),
    ("/traits/HW_CPU_X86_AVX", {}, 403),
    # noauth2's roles: "admin" for the admin token unless X-Roles is sent;
    # X-Roles, when present (even empty), wins over X-Role.
    ("/resource_providers/{rp}/usages", {"X-Auth-Token": "admin"}, 200),
    ("/resource_providers/{rp}/usages", {"X-Auth-Token": "admin", "X-Roles": "reader"}, 403),
    ("/resource_providers/{rp}/usages", {"X-Auth-Token": "admin", "X-Roles": ""}, 403),
    ("/resource_providers/{rp}/usages", {"X-Auth-Token": "admin", "X-Role": "reader"}, 200),
    ("/resource_providers/{rp}/usages", {"X-Roles": "admin"}, 200),
    ("/resource_providers/{rp}/usages", {"X-Role": "admin"}, 403),  # Allotment: 200
    ("/resource_providers/{rp}/usages", {"X-Roles": "reader", "X-Role": "admin"}, 403),
    # The user is the token's: X-User-Id or X-User sent along do not change it.
    ("/resource_providers/{rp}/inventories", {"X-Auth-Token": "alice"}, 200),
    ("/resource_providers/{rp}/inventories", {"X-User-Id": "alice"}, 403),
    ("/resource_providers/{rp}/inventories", {"X-User": "alice"}, 403),
    ("/resource_providers/{rp}/inventories", {"X-Auth-Token": ":x", "X-User-Id": "alice"}, 403),
]


@pytest.mark.parametrize("path, headers, status", CASES)
def test_the_policy_sees_the_context_placement_builds(guarded, path, headers, status):
    api, rp = guarded
    response = api.request("GET", path.format(rp=rp), headers=headers)
    assert response.status == status, response.text


# -- keystone: no user after authentication is 401 ---------------------------

@pytest.fixture
def keystone_api(db_url, tmp_path):
    """auth_token deferring its decision, with no keystone to ask."""
    from allotment import config
    from allotment.api.app import Application
    from allotment.service import database_from_config

    path = tmp_path / "placement.conf"
    path.write_text(textwrap.dedent(f"""\
        [placement_database]
        connection = {db_url}
        [api]
        auth_strategy = keystone
        [keystone_authtoken]
        delay_auth_decision = true
        www_authenticate_uri = http://127.0.0.1:9/
        auth_url = http://127.0.0.1:9/
        http_connect_timeout = 1
        """))
    conf = config.load(str(path), args=[])
    application = Application(conf, database_from_config(conf))
    yield ApiClient(application, token="")
    application.db.dispose()


@pytest.mark.parametrize("headers", [{}, {"X-User-Id": "admin", "X-Roles": "admin"}, {"X-User": "admin"}])
def test_keystone_without_a_user_is_401_as_placement(keystone_api, headers):
    # The reference: 401, keystonemiddleware's WWW-Authenticate, no version
    # header (Allotment: the handler ran, and policy answered 403).
    response = keystone_api.get("/resource_providers", headers=headers)
    assert response.status == 401, response.text
    assert response.headers["WWW-Authenticate"] == 'Keystone uri="http://127.0.0.1:9/"'
    assert response.json["title"] == "Unauthorized"
    assert "OpenStack-API-Version" not in response.headers


def test_keystone_root_needs_no_user(keystone_api):
    assert keystone_api.get("/").status == 200
