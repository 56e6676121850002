"""``/traits`` and ``/traits/{name}`` (1.6+)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import sqlalchemy as sa

from allotment.db import tables
from tests.conftest import new_uuid

HTTP_DATE = r"^\w+, \d+ \w+ \d{4} [\d:]+ GMT$"
INVALID_TRAIT = ('The trait is invalid. A valid trait must be no longer than 255 characters, start with '
                 'the prefix "CUSTOM_" and use following characters: "A"-"Z", "0"-"9" and "_"')


def trait_names(resp) -> list[str]:
    assert resp.status == 200, resp
    return resp.json["traits"]


def give_provider(app, *traits: str) -> int:
    """A provider holding ``traits``, written straight to the tables."""
    with app.db.write() as conn:
        rp_id = conn.execute(tables.resource_providers.insert().values(
            uuid=new_uuid(), name="rp-" + new_uuid(), generation=0)).inserted_primary_key[0]
        for name in traits:
            trait_id = conn.execute(sa.select(tables.traits.c.id).where(tables.traits.c.name == name)).scalar_one()
            conn.execute(tables.resource_provider_traits.insert().values(
                resource_provider_id=rp_id, trait_id=trait_id))
    return rp_id


# -- PUT /traits/{name} ------------------------------------------------------------

def test_put_creates_then_confirms_a_custom_trait(api):
    first = api.put("/traits/CUSTOM_TRAIT_1", version="1.6")
    assert first.status == 201
    assert first.headers["Location"].endswith("/traits/CUSTOM_TRAIT_1")
    assert "Content-Type" not in first.headers
    assert "Last-Modified" not in first.headers and "Cache-Control" not in first.headers
    second = api.put("/traits/CUSTOM_TRAIT_1", version="1.6")
    assert second.status == 204
    assert second.headers["Location"].endswith("/traits/CUSTOM_TRAIT_1")


def test_put_has_cache_headers_from_1_15(api):
    for status in (201, 204):
        resp = api.put("/traits/CUSTOM_CACHED", version="1.15")
        assert resp.status == status
        assert resp.headers["Cache-Control"] == "no-cache"
        assert re.match(HTTP_DATE, resp.headers["Last-Modified"])
    assert "Last-Modified" not in api.put("/traits/CUSTOM_CACHED", version="1.14").headers


def test_put_invalid_names_are_400_and_create_nothing(api):
    for name in ("TRAIT_X", "CUSTOM_ABC:1", "CUSTOM_lower", "CUSTOM_", "CUSTOM_" + "A" * 249):
        resp = api.put(f"/traits/{name}")
        assert resp.status == 400, name
        assert INVALID_TRAIT in resp.error()["detail"]
    assert trait_names(api.get("/traits?name=startswith:CUSTOM_")) == []


def test_put_longest_valid_name(api):
    assert api.put("/traits/CUSTOM_" + "A" * 248).status == 201


def test_traits_need_1_6(api):
    assert api.put("/traits/CUSTOM_TRAIT_1", version="1.5").status == 404
    assert api.get("/traits/HW_CPU_X86_SSE", version="1.5").status == 404
    assert api.get("/traits", version="1.5").status == 404
    assert api.delete("/traits/CUSTOM_TRAIT_1", version="1.5").status == 404


def test_concurrent_puts_create_once(api):
    with ThreadPoolExecutor(max_workers=6) as pool:
        statuses = sorted(pool.map(lambda _: api.put("/traits/CUSTOM_ONCE").status, range(12)))
    assert statuses == [201] + [204] * 11


# -- GET /traits/{name} --------------------------------------------------------------

def test_show_trait(api):
    api.put("/traits/CUSTOM_SHOWN")
    resp = api.get("/traits/CUSTOM_SHOWN", version="1.6")
    assert resp.status == 204
    assert "Content-Type" not in resp.headers
    assert "Last-Modified" not in resp.headers
    assert api.get("/traits/HW_CPU_X86_SSE").status == 204
    new = api.get("/traits/CUSTOM_SHOWN", version="1.15")
    assert new.status == 204
    assert new.headers["Cache-Control"] == "no-cache"
    assert re.match(HTTP_DATE, new.headers["Last-Modified"])


def test_show_unknown_trait_is_404(api):
    resp = api.get("/traits/NON_EXISTED")
    assert resp.status == 404
    assert "No such trait(s): NON_EXISTED." in resp.error()["detail"]


# -- DELETE /traits/{name} ----------------------------------------------------------

def test_delete_custom_trait(api):
    api.put("/traits/CUSTOM_GONE")
    resp = api.delete("/traits/CUSTOM_GONE", version="1.15")
    assert resp.status == 204
    assert "Content-Type" not in resp.headers and "Last-Modified" not in resp.headers
    assert api.get("/traits/CUSTOM_GONE").status == 404
    assert api.delete("/traits/CUSTOM_GONE").status == 404


def test_delete_standard_trait_is_400(api):
    resp = api.delete("/traits/HW_CPU_X86_SSE")
    assert resp.status == 400
    assert "Cannot delete standard trait HW_CPU_X86_SSE." in resp.error()["detail"]
    assert api.get("/traits/HW_CPU_X86_SSE").status == 204


def test_delete_trait_in_use_is_409(api, app):
    api.put("/traits/CUSTOM_USED")
    give_provider(app, "CUSTOM_USED")
    resp = api.delete("/traits/CUSTOM_USED")
    assert resp.status == 409
    assert "The trait CUSTOM_USED is in use by a resource provider." in resp.error()["detail"]
    assert api.get("/traits/CUSTOM_USED").status == 204


# -- GET /traits ------------------------------------------------------------------------

def test_list_has_standard_and_custom_traits_sorted(api):
    api.put("/traits/CUSTOM_TRAIT_2")
    api.put("/traits/CUSTOM_TRAIT_1")
    names = trait_names(api.get("/traits", version="1.6"))
    assert {"CUSTOM_TRAIT_1", "CUSTOM_TRAIT_2", "MISC_SHARES_VIA_AGGREGATE", "HW_CPU_X86_SHA"} <= set(names)
    assert names == sorted(names)


def test_list_name_in_filter(api):
    api.put("/traits/CUSTOM_TRAIT_1")
    api.put("/traits/CUSTOM_TRAIT_2")
    assert trait_names(api.get("/traits?name=in:CUSTOM_TRAIT_1,CUSTOM_TRAIT_2,CUSTOM_MISSING")) == \
        ["CUSTOM_TRAIT_1", "CUSTOM_TRAIT_2"]


def test_list_startswith_filter_is_exact_and_case_sensitive(api):
    for name in ("CUSTOM_TRAIT_1", "CUSTOM_TRAIT_2", "CUSTOM_TRAITX", "CUSTOM_ANOTHER_TRAIT"):
        api.put(f"/traits/{name}")
    # "_" is literal, not a LIKE wildcard; lower case matches nothing.
    assert trait_names(api.get("/traits?name=startswith:CUSTOM_TRAIT_")) == ["CUSTOM_TRAIT_1", "CUSTOM_TRAIT_2"]
    assert trait_names(api.get("/traits?name=startswith:custom_trait")) == []
    assert trait_names(api.get("/traits?name=startswith:CUSTOM_%")) == []


def test_list_unknown_name_operator_filters_nothing(api):
    assert len(trait_names(api.get("/traits?name=foo:bar"))) > 100


def test_list_associated_filter(api, app):
    api.put("/traits/CUSTOM_ON")
    api.put("/traits/CUSTOM_OFF")
    give_provider(app, "CUSTOM_ON", "HW_CPU_X86_SSE")
    assert trait_names(api.get("/traits?associated=true")) == ["CUSTOM_ON", "HW_CPU_X86_SSE"]
    assert trait_names(api.get("/traits?associated=TRUE&name=startswith:CUSTOM")) == ["CUSTOM_ON"]
    unassociated = trait_names(api.get("/traits?associated=false"))
    assert "CUSTOM_OFF" in unassociated and "CUSTOM_ON" not in unassociated


def test_list_bad_query_is_400(api):
    resp = api.get("/traits?name=in_abc")
    assert resp.status == 400
    assert ('Badly formatted name parameter. Expected name query string parameter in form: '
            '?name=[in|startswith]:[name1,name2|prefix]. Got: "in_abc"') in resp.error()["detail"]
    resp = api.get("/traits?associated=xyz")
    assert resp.status == 400
    assert 'The query parameter "associated" only accepts "true" or "false"' in resp.error()["detail"]
    resp = api.get("/traits?invalid=abc")
    assert resp.status == 400
    assert "Invalid query string parameters: Additional properties are not allowed" in resp.error()["detail"]


def test_list_cache_headers_from_1_15(api):
    assert "Last-Modified" not in api.get("/traits", version="1.14").headers
    resp = api.get("/traits", version="1.15")
    assert resp.headers["Cache-Control"] == "no-cache"
    assert re.match(HTTP_DATE, resp.headers["Last-Modified"])
    empty = api.get("/traits?name=in:CUSTOM_NONE", version="1.15")
    assert empty.json == {"traits": []}
    assert re.match(HTTP_DATE, empty.headers["Last-Modified"])


def test_non_admin_is_forbidden(api):
    assert api.get("/traits", token="user").status == 403
    assert api.put("/traits/CUSTOM_X", token="user").status == 403
