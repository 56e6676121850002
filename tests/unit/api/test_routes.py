"""The route table's declarations: success statuses and schemas by microversion."""

from __future__ import annotations

import pytest

from allotment.api.microversion import Version, Versioned
from allotment.api import resource_providers, root, traits
from allotment.api.endpoint import OWN_PREFIX, Answer, Endpoint, schema_at
from allotment.api.routes import OWN_ROUTES, ROUTES


def test_versioned_steps():
    steps = Versioned({"1.14": "b", "1.0": "a", "1.7": None})
    assert [steps.at(Version(1, minor)) for minor in (0, 6, 7, 13, 14, 39)] == ["a", "a", None, None, "b", "b"]
    assert Versioned({"1.2": "x"}).at(Version(1, 1)) is None


def test_success_statuses_by_version():
    endpoint = Endpoint(resource_providers.create_resource_provider, None,
                        answers=(Answer(201), Answer(200, json=True, since=Version(1, 20))))
    assert endpoint.answers_at(Version(1, 19)) == [(201, False)]
    assert endpoint.answers_at(Version(1, 20)) == [(200, True)]
    put_trait = Endpoint(traits.put_trait, None, min_version=Version(1, 6), answers=(Answer(201), Answer(204)))
    assert put_trait.answers_at(Version(1, 5)) == []
    assert put_trait.answers_at(Version(1, 6)) == [(201, False), (204, False)]
    assert Endpoint(root.home, None).answers_at(Version(1, 0)) == [(200, True)]


def test_a_body_schema_means_a_json_body_unless_said_otherwise():
    assert Endpoint(root.home, None, body={"type": "object"}).accepts_json is True
    assert Endpoint(root.home, None, body={"type": "object"}, accepts_json=False).accepts_json is False
    assert Endpoint(root.home, None).accepts_json is False


def test_every_declared_schema_resolves_at_every_version_the_route_serves():
    for table in (ROUTES, OWN_ROUTES):
        for template, methods in table.items():
            for method, endpoint in methods.items():
                for minor in range(endpoint.min_version.minor, 40):
                    for declared in (endpoint.body, endpoint.query):
                        schema = schema_at(declared, Version(1, minor))
                        assert schema is None or isinstance(schema, dict), (method, template, minor)
                if (method, template) != ("PUT", "/resource_classes/{name}"):  # its handler checks
                    assert (endpoint.body is not None) == endpoint.accepts_json, (method, template)


@pytest.mark.parametrize("template", list(OWN_ROUTES))
def test_our_own_routes_stay_out_of_placements_url_space(template):
    assert template.startswith(OWN_PREFIX) or template == "/metrics"  # where Prometheus scrapers look
    assert not set(OWN_ROUTES) & set(ROUTES)
