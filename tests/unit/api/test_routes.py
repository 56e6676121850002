"""The route table's declarations: success statuses and schemas by microversion."""

from __future__ import annotations

import pytest

from allotment.api.microversion import Version, Versioned
from allotment.api.routes import E, OWN_PREFIX, OWN_ROUTES, ROUTES, schema_at


def test_versioned_steps():
    steps = Versioned({"1.14": "b", "1.0": "a", "1.7": None})
    assert [steps.at(Version(1, minor)) for minor in (0, 6, 7, 13, 14, 39)] == ["a", "a", None, None, "b", "b"]
    assert Versioned({"1.2": "x"}).at(Version(1, 1)) is None


def test_success_statuses_by_version():
    endpoint = E("resource_providers:create_resource_provider", None, ok="1.0: 201; 1.20: 200 json")
    assert endpoint.answers_at(Version(1, 19)) == [(201, False)]
    assert endpoint.answers_at(Version(1, 20)) == [(200, True)]
    assert E("traits:put_trait", None, "1.6", ok="201, 204").answers_at(Version(1, 6)) == [(201, False), (204, False)]
    assert E("root:home", None).answers_at(Version(1, 0)) == [(200, True)]


def test_every_declared_schema_resolves_at_every_version_the_route_serves():
    for table in (ROUTES, OWN_ROUTES):
        for template, methods in table.items():
            for method, endpoint in methods.items():
                for minor in range(endpoint.min_version.minor, 40):
                    for reference in (endpoint.body, endpoint.query):
                        schema = schema_at(reference, Version(1, minor))
                        assert schema is None or isinstance(schema, dict), (method, template, minor)
                if (method, template) != ("PUT", "/resource_classes/{name}"):  # its handler checks
                    assert (endpoint.body is not None) == endpoint.accepts_json, (method, template)


@pytest.mark.parametrize("template", list(OWN_ROUTES))
def test_our_own_routes_stay_out_of_placements_url_space(template):
    assert template.startswith(OWN_PREFIX) or template == "/metrics"  # where Prometheus scrapers look
    assert not set(OWN_ROUTES) & set(ROUTES)
