"""Microversion negotiation: remembered answers are the same answers."""

from __future__ import annotations

import pytest

from allotment.api import microversion


@pytest.mark.parametrize("value,error", [("placement 1.99", microversion.UnacceptableVersion),
                                         ("placement x", microversion.InvalidVersion),
                                         ("placement 1", microversion.InvalidVersion)])
def test_a_refused_header_is_refused_every_time(value, error):
    for _ in range(3):
        with pytest.raises(error):
            microversion.negotiate(value)
    assert value not in microversion._NEGOTIATED


def test_accepted_headers_are_remembered_up_to_a_bound(monkeypatch):
    monkeypatch.setattr(microversion, "_NEGOTIATED", {})
    monkeypatch.setattr(microversion, "MAX_NEGOTIATED", 3)
    values = [None, "placement 1.39", "placement latest", "compute 2.1, placement 1.05", "placement 1.2"]
    expected = [(1, 0), (1, 39), microversion.MAX_VERSION, (1, 5), (1, 2)]
    for _ in range(2):
        assert [microversion.negotiate(value) for value in values] == expected
    assert len(microversion._NEGOTIATED) == 3


def test_response_headers():
    assert microversion.response_headers(microversion.Version(1, 39)) == (
        ("OpenStack-API-Version", "placement 1.39"), ("Vary", "openstack-api-version"))
