"""Fixtures of the browser tests: a real ``allotment serve`` seeded with a
small cloud (tests/browser/cloud.py) and Debian's Chromium driven by
Playwright.

They run once, in the SQLite pass (the page reads the same API on every
backend, and the JSON behind it is tested on each in
tests/functional/test_capacity.py).  Without a Chromium they are skipped
with a warning, except under ``CI=true`` where that is a failure
(``scripts/test`` installs Debian's ``chromium`` when it can).  All of them
share one server: they form one xdist group (``--dist loadgroup``).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from tests.browser import driver
from tests.conftest import BACKEND, create_database

IN_CI = os.environ.get("CI") == "true"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.xdist_group("browser"))


def _unavailable() -> str | None:
    if BACKEND != "sqlite":
        return None
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -e '.[test]')"
    if driver.chromium_path() is None:
        return "no Chromium: install Debian's chromium package (scripts/test does: apt-get install -y chromium)"
    return None


@pytest.fixture(scope="session")
def playwright_browser():
    if BACKEND != "sqlite":
        pytest.skip("browser tests run once, in the SQLite pass")
    missing = _unavailable()
    if missing:
        if IN_CI:
            pytest.fail(f"browser tests cannot run under CI: {missing}")
        warnings.warn(f"SKIPPING the browser tests: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = driver.launch(playwright)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def live(tmp_path_factory, playwright_browser):
    """(server, names of the seeded cloud)."""
    from tests.browser.cloud import seed
    from tests.functional.test_server import running, write_config

    url, drop = create_database(tmp_path_factory, "ui")
    config = write_config(tmp_path_factory.mktemp("ui"), url, extra="[allotment]\nui = true\n")
    try:
        with running(config, "--workers", "1", "--threads", "4") as server:
            yield server, seed(server.url)
    finally:
        drop()


@pytest.fixture
def page(playwright_browser, live):
    """A fresh tab (its own sessionStorage) that records every URL it asks for."""
    context = playwright_browser.new_context(viewport={"width": 1200, "height": 900})
    tab = context.new_page()
    tab.requested = []
    tab.errors = []
    tab.on("request", lambda request: tab.requested.append(request.url))
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    tab.on("console", lambda message: tab.errors.append(message.text) if message.type == "error" else None)
    yield tab
    context.close()
    server, _ = live
    foreign = [url for url in tab.requested if not url.startswith(server.url + "/")]
    assert not foreign, f"the page asked another server: {foreign}"
    assert not tab.errors, f"errors in the page: {tab.errors}"


def screenshot(page, name: str) -> None:
    """docs/screenshots/NAME.png, only when ALLOTMENT_SCREENSHOTS=1 (CI never rewrites them)."""
    if os.environ.get("ALLOTMENT_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
