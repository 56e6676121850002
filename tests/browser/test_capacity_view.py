"""The capacity view in a real browser, against a real ``allotment serve``.

Each view is loaded as an operator would load it and what it shows is
compared with what the HTTP API answers for the same cloud (Placement's
routes where they can say it, the capacity JSON where they cannot).
"""

from __future__ import annotations

import re
from collections import defaultdict

import requests

from tests.browser import driver
from tests.browser.conftest import screenshot

HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}


def get(live, path: str, version: str = "1.39") -> dict:
    server, _ = live
    response = requests.get(server.url + path, headers=dict(HEADERS, **{
        "OpenStack-API-Version": f"placement {version}"}), timeout=30)
    assert response.status_code == 200, (path, response.text)
    return response.json()


def number(text: str) -> int:
    """The first number of a cell: ``"194,560 (190 GiB)"`` -> 194560."""
    found = re.search(r"-?[\d,]+", text)
    assert found, text
    return int(found.group(0).replace(",", ""))


def cells(row) -> dict[str, int]:
    return {cell.get_attribute("data-field"): number(cell.inner_text())
            for cell in row.query_selector_all("td[data-field]")}


def capacity(inv: dict) -> int:
    return int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])


def placement_sums(live, providers) -> dict:
    sums: dict = defaultdict(lambda: defaultdict(int))
    for rp in providers:
        inventories = get(live, f"/resource_providers/{rp['uuid']}/inventories")["inventories"]
        usages = get(live, f"/resource_providers/{rp['uuid']}/usages")["usages"]
        for rc, inv in inventories.items():
            sums[rc]["total"] += inv["total"]
            sums[rc]["reserved"] += inv["reserved"]
            sums[rc]["capacity"] += capacity(inv)
            sums[rc]["used"] += usages[rc]
    for found in sums.values():
        found["free"] = found["capacity"] - found["used"]
    return {rc: dict(found) for rc, found in sums.items()}


def shown_classes(page) -> dict:
    return {row.get_attribute("data-rc"): cells(row) for row in page.query_selector_all("table.classes tbody tr")}


# -- signing in ---------------------------------------------------------------

def test_overview_shows_the_cloud_as_placement_reports_it(page, live):
    server, _ = live
    driver.sign_in(page, server.url)
    providers = get(live, "/resource_providers")["resource_providers"]
    assert shown_classes(page) == placement_sums(live, providers)
    counts = {card.get_attribute("data-count"): number(card.inner_text())
              for card in page.query_selector_all("[data-count]")}
    consumers = set()
    for rp in providers:
        consumers |= set(get(live, f"/resource_providers/{rp['uuid']}/allocations")["allocations"])
    assert counts == {"providers": len(providers),
                      "roots": sum(rp["uuid"] == rp["root_provider_uuid"] for rp in providers),
                      "consumers": len(consumers)}
    bar = page.query_selector("table.classes tr[data-rc='VCPU'] .bar")
    assert bar.get_attribute("role") == "img" and "VCPU" in bar.get_attribute("aria-label")
    screenshot(page, "overview")


def test_overview_filtered_by_aggregate_and_trait(page, live):
    server, names = live
    driver.sign_in(page, server.url)
    aggregate = names["aggregates"]["rack-b"]
    page.select_option("#f-aggregate", aggregate)
    page.select_option("#f-trait", "COMPUTE_VOLUME_MULTI_ATTACH")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.click("form.filters button[type=submit]")
    driver.wait_ready(page, "overview")
    expected = get(live, f"/allotment/capacity?member_of={aggregate}&trait=COMPUTE_VOLUME_MULTI_ATTACH")
    assert shown_classes(page) == {row.pop("resource_class"): row for row in expected["resource_classes"]}
    assert number(page.inner_text("[data-count='providers']")) == expected["providers"]
    # The filter is in the address: it survives a reload and can be shared.
    assert aggregate in page.url
    # Every provider under rack-b's roots (both have the trait on the root) is counted.
    members = get(live, f"/resource_providers?member_of={aggregate}")["resource_providers"]
    with_trait = {rp["uuid"] for rp in get(live, "/resource_providers?required=COMPUTE_VOLUME_MULTI_ATTACH")[
        "resource_providers"]}
    trees = [rp for root in members if root["uuid"] in with_trait
             for rp in get(live, f"/resource_providers?in_tree={root['uuid']}")["resource_providers"]]
    assert expected["providers"] == len(trees)
    screenshot(page, "overview-filtered")


def test_a_wrong_token_gets_the_login_form_back(page, live):
    server, _ = live
    driver.sign_in(page, server.url, token="alice:proj-alpha", view="login")
    assert page.is_visible("#login-form")
    assert "403" in page.inner_text("#login-error")
    assert page.evaluate("sessionStorage.getItem('allotment.token')") is None
    # A token refused later (401: expired, revoked) also brings the form back.
    # noauth2 refuses no token, so the identity service's answer is played here.
    driver.sign_in(page, server.url)
    page.route("**/allotment/capacity/trees*", lambda route: route.fulfill(
        status=401, headers={"Content-Type": "application/json"},
        body='{"errors": [{"status": 401, "title": "Unauthorized", "detail": "expired"}]}'))
    driver.open_view(page, "#/trees", "login")
    assert "401" in page.inner_text("#login-error")
    assert page.evaluate("sessionStorage.getItem('allotment.token')") is None
    page.errors[:] = [e for e in page.errors if "Failed to load resource" not in e]  # the refused requests


# -- trees --------------------------------------------------------------------

def test_trees_page_search_and_order(page, live):
    server, names = live
    driver.sign_in(page, server.url)
    driver.open_view(page, "#/trees", "trees")
    providers = get(live, "/resource_providers")["resource_providers"]
    roots = sorted(rp["name"] for rp in providers if rp["uuid"] == rp["root_provider_uuid"])
    shown = [a.inner_text() for a in page.query_selector_all("article.tree > header h3 a")]
    assert shown == roots[:20]
    assert f"of {len(roots)}" in page.inner_text(".page-info")
    screenshot(page, "trees")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.click("nav.pager >> text=Next →")
    driver.wait_ready(page, "trees")
    assert [a.inner_text() for a in page.query_selector_all("article.tree > header h3 a")] == roots[20:40]
    # Nested providers of a tree, with the usage Placement reports.
    page.fill("#t-search", "GPU0")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.press("#t-search", "Enter")
    driver.wait_ready(page, "trees")
    assert sorted(a.inner_text() for a in page.query_selector_all("article.tree > header h3 a")) == ["cn-02", "cn-05"]
    gpu = names["cn-02-gpu0"]
    usage = get(live, f"/resource_providers/{gpu}/usages")["usages"]["VGPU"]
    total = capacity(get(live, f"/resource_providers/{gpu}/inventories/VGPU"))
    assert page.inner_text(f"li[data-uuid='{gpu}'] .bar-label[data-rc='VGPU']") == f"{usage} / {total} used"
    assert "CUSTOM_GOLD" in page.inner_text(f"li[data-uuid='{gpu}'] .chips")
    screenshot(page, "trees-search")
    # Fullest first: cn-03's memory is the most used of any tree.
    page.fill("#t-search", "")
    page.select_option("#t-sort", "fullness")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.click("form.filters button[type=submit]")
    driver.wait_ready(page, "trees")
    expected = get(live, "/allotment/capacity/trees?sort=fullness&limit=20")["trees"]
    assert [a.inner_text() for a in page.query_selector_all("article.tree > header h3 a")] == [
        t["name"] for t in expected]
    assert expected[0]["name"] == "cn-03"


# -- one provider -----------------------------------------------------------

def test_provider_view_lists_inventories_and_consumers(page, live):
    server, names = live
    driver.sign_in(page, server.url)
    driver.open_view(page, "#/trees?search=cn-02", "trees")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.click("text=cn-02-numa0")
    driver.wait_ready(page, "provider")
    uuid = names["cn-02-numa0"]
    assert page.inner_text("#view h1") == "cn-02-numa0"
    inventories = get(live, f"/resource_providers/{uuid}/inventories")["inventories"]
    usages = get(live, f"/resource_providers/{uuid}/usages")["usages"]
    for rc, inv in inventories.items():
        row = cells(page.query_selector(f"table.inventories tr[data-rc='{rc}']"))
        assert row["total"] == inv["total"] and row["reserved"] == inv["reserved"]
        assert row["used"] == usages[rc] and row["capacity"] == capacity(inv)
        assert row["allocation_ratio"] == int(inv["allocation_ratio"])
        units = page.get_attribute(f"table.inventories tr[data-rc='{rc}'] td[data-field='units']", "title")
        assert units == f"min_unit {inv['min_unit']}, max_unit {inv['max_unit']}, step_size {inv['step_size']}"
    allocations = get(live, f"/resource_providers/{uuid}/allocations")["allocations"]
    rows = page.query_selector_all("table.consumers tbody tr")
    assert {row.get_attribute("data-consumer") for row in rows} == set(allocations)
    for row in rows:
        consumer = row.get_attribute("data-consumer")
        held = get(live, f"/allocations/{consumer}")
        texts = [cell.inner_text() for cell in row.query_selector_all("td")]
        assert texts[1:4] == [held["project_id"], held["user_id"], held["consumer_type"]]
        assert {span.get_attribute("data-rc"): number(span.inner_text().split(" ", 1)[1])
                for span in row.query_selector_all("span[data-rc]")} == allocations[consumer]["resources"]
    screenshot(page, "provider")
    # A provider that borrows disk from a sharing provider says so.
    driver.open_view(page, f"#/provider/{names['cn-05']}", "provider")
    sharing = get(live, "/resource_providers?required=MISC_SHARES_VIA_AGGREGATE")["resource_providers"]
    assert [li.get_attribute("data-uuid") for li in page.query_selector_all("ul.sharing li")] == [
        s["uuid"] for s in sharing]


# -- projects -----------------------------------------------------------------

def test_projects_view_matches_get_usages(page, live):
    server, _ = live
    driver.sign_in(page, server.url)
    driver.open_view(page, "#/projects", "projects")
    groups = page.query_selector_all("table.projects tbody[data-project]")
    assert {g.get_attribute("data-project") for g in groups} == {"proj-alpha", "proj-beta", "proj-gamma"}
    for group in groups:
        project = group.get_attribute("data-project")
        usages = get(live, f"/usages?project_id={project}", version="1.38")["usages"]
        expected: dict = defaultdict(int)
        for by_type in usages.values():
            for rc, n in by_type.items():
                if rc != "consumer_count":
                    expected[rc] += n
        row = group.query_selector("tr.project")
        shown = {cell.get_attribute("data-rc"): number(cell.inner_text())
                 for cell in row.query_selector_all("td[data-rc]") if cell.inner_text() != "—"}
        assert shown == dict(expected)
        assert number(row.query_selector("td[data-field='consumers']").inner_text()) == sum(
            by_type["consumer_count"] for by_type in usages.values())
    # The biggest first: proj-beta holds the one FPGA of two, the largest share.
    assert groups[0].get_attribute("data-project") == "proj-beta"
    toggle = groups[0].query_selector("button.toggle")
    assert toggle.get_attribute("aria-expanded") == "false"
    toggle.focus()
    page.keyboard.press("Enter")
    assert toggle.get_attribute("aria-expanded") == "true"
    users = groups[0].query_selector_all("tr.user")
    assert all(user.is_visible() for user in users) and len(users) == 2
    for user in users:
        name = user.get_attribute("data-user")
        mine = get(live, f"/usages?project_id=proj-beta&user_id={name}", version="1.9")["usages"]
        assert {c.get_attribute("data-rc"): number(c.inner_text()) for c in user.query_selector_all("td[data-rc]")
                if c.inner_text() != "—"} == mine
    screenshot(page, "projects")


# -- why doesn't it fit? --------------------------------------------------------

def test_fit_form_shows_candidates_when_the_request_fits(page, live):
    server, _ = live
    driver.sign_in(page, server.url)
    driver.open_view(page, "#/fit", "fit")
    page.fill("#g0-resources", "VCPU:2,MEMORY_MB:2048")
    page.fill("#g0-member_of", live[1]["aggregates"]["rack-a"])
    page.fill("#fit-limit", "5")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.click("text=Find candidates")
    driver.wait_ready(page, "fit")
    expected = get(live, "/allocation_candidates?resources=VCPU:2,MEMORY_MB:2048&limit=5"
                         f"&member_of={live[1]['aggregates']['rack-a']}")
    assert page.get_attribute(".verdict", "data-outcome") == "candidates"
    rows = page.query_selector_all("table.candidates tbody tr")
    assert len(rows) == len(expected["allocation_requests"]) > 0
    for row, request in zip(rows, expected["allocation_requests"]):
        links = [a.get_attribute("href").split("/")[-1] for a in row.query_selector_all("a")]
        assert sorted(links) == sorted(request["allocations"])
    screenshot(page, "fit-candidates")


def test_fit_form_explains_why_nothing_fits(page, live):
    server, _ = live
    driver.sign_in(page, server.url)
    driver.open_view(page, "#/fit", "fit")
    page.fill("#g0-resources", "VCPU:8,MEMORY_MB:65536")
    page.fill("#g0-required", "HW_CPU_X86_AVX2")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.press("#g0-required", "Enter")
    driver.wait_ready(page, "fit")
    query = "resources=VCPU:8,MEMORY_MB:65536&required=HW_CPU_X86_AVX2&limit=10"
    assert get(live, "/allocation_candidates?" + query)["allocation_requests"] == []
    report = get(live, "/allotment/explain?" + query)
    assert page.inner_text(".explain .verdict") == "It does not fit. " + report["verdict"]
    assert len(page.query_selector_all("table.steps tbody tr")) == len(report["steps"])
    assert [li.inner_text() for li in page.query_selector_all("ul.reasons li")] == [
        f"{r['reason']}: {r['trees']} tree{'s' if r['trees'] != 1 else ''}" for r in report["reasons"]]
    assert [a.inner_text() for a in page.query_selector_all("ol.closest > li > a")] == [
        c["tree"]["name"] for c in report["closest"]]
    screenshot(page, "fit-explain")


def test_fit_form_with_a_request_group_and_a_bad_request(page, live):
    server, _ = live
    driver.sign_in(page, server.url)
    driver.open_view(page, "#/fit", "fit")
    page.click("text=Add a request group")
    page.fill("#g0-resources", "VCPU:1")
    page.fill("#g1-resources", "VGPU:1")
    page.fill("#g1-required", "CUSTOM_GOLD")
    page.select_option("#fit-policy", "isolate")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.click("text=Find candidates")
    driver.wait_ready(page, "fit")
    expected = get(live, "/allocation_candidates?resources=VCPU:1&resources1=VGPU:1&required1=CUSTOM_GOLD"
                         "&group_policy=isolate&limit=10")
    assert len(page.query_selector_all("table.candidates tbody tr")) == len(expected["allocation_requests"]) > 0
    page.fill("#g0-resources", "NOT_A_CLASS:1")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.click("text=Find candidates")
    driver.wait_ready(page, "fit")
    assert page.get_attribute("[data-outcome='error']", "role") == "alert"
    assert "NOT_A_CLASS" in page.inner_text("[data-outcome='error']")
    page.errors[:] = [e for e in page.errors if "Failed to load resource" not in e]  # the refused request


# -- narrow window, keyboard --------------------------------------------------

def test_readable_in_a_narrow_window_and_usable_by_keyboard(page, live):
    server, _ = live
    page.set_viewport_size({"width": 390, "height": 844})
    driver.sign_in(page, server.url)
    for fragment, view in (("#/overview", "overview"), ("#/trees", "trees"), ("#/fit", "fit")):
        driver.open_view(page, fragment, view)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{view}: the page is {overflow}px wider than the window"
    driver.open_view(page, "#/overview", "overview")
    screenshot(page, "overview-narrow")
    # From the skip link (the first stop of the page), Tab reaches the views' links, and Enter follows one.
    page.focus("a.skip")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Overview"
    page.keyboard.press("Tab")
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.keyboard.press("Enter")
    driver.wait_ready(page, "trees")


def test_served_from_the_package_with_its_security_headers(live):
    server, _ = live
    response = requests.get(server.url + "/allotment/ui", timeout=30)
    assert response.status_code == 200
    assert "connect-src 'self'" in response.headers["Content-Security-Policy"]
    assert requests.get(server.url + "/allotment/ui/", allow_redirects=False, timeout=30).status_code == 301
    assert requests.get(server.url + "/allotment/capacity/", timeout=30).status_code == 401
