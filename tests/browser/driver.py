"""Driving the capacity view in Debian's Chromium with Playwright.

Shared by the browser tests and ``tools/ui-timing``, so the timing is taken
the way the tests drive the page.  Playwright's own browser downloads are
never used: ``executable_path`` points at the system's ``chromium``.
"""

from __future__ import annotations

import os
import shutil

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


def chromium_path() -> str | None:
    """``$ALLOTMENT_CHROMIUM``, else Debian's ``/usr/bin/chromium``, else ``chromium`` on PATH."""
    for candidate in (os.environ.get("ALLOTMENT_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def launch(playwright):
    return playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)


def wait_ready(page, view: str, timeout: float = 30_000) -> None:
    """Until the page has drawn ``view`` (``html[data-view][data-state=ready]``)."""
    page.wait_for_selector(f"html[data-view='{view}'][data-state='ready']", state="attached", timeout=timeout)


def sign_in(page, base_url: str, token: str = "admin", view: str = "overview") -> None:
    page.goto(base_url + "/allotment/ui")
    wait_ready(page, "login")
    page.fill("#token", token)
    # The sign-in form's own view is drawn and ready: mark it stale, or a
    # wait for the login view (a refused token) would end before the page
    # has even asked (it hides the form and navigates first).
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.press("#token", "Enter")  # the keyboard is enough to sign in
    if view:
        wait_ready(page, view)


def open_view(page, fragment: str, view: str) -> None:
    """Go to ``#/fragment`` and wait until it is drawn."""
    page.evaluate("document.documentElement.dataset.state = 'navigating'")
    page.evaluate("""(f) => {
        if (location.hash === f) window.dispatchEvent(new HashChangeEvent('hashchange'));  // drawn again
        else location.hash = f;
    }""", fragment)
    wait_ready(page, view)


def paint_ms(page, base_url: str, fragment: str = "#/overview", view: str = "overview",
             token: str = "admin") -> float:
    """Milliseconds from navigation start to the first paint of ``view``
    with its data: the page is loaded with the token already in the tab,
    and it marks ``allotment:painted:VIEW`` two animation frames after
    drawing (by then the frame holding the data has been painted)."""
    # The token goes into the tab from the style sheet's URL (same origin, no
    # script runs there), so the one navigation measured is the page's own.
    page.goto(base_url + "/allotment/ui/app.css")
    page.evaluate("(t) => sessionStorage.setItem('allotment.token', t)", token)
    page.goto(base_url + "/allotment/ui" + fragment)
    wait_ready(page, view, timeout=120_000)
    mark = f"allotment:painted:{view}"
    page.wait_for_function(f"performance.getEntriesByName('{mark}').length > 0")
    return page.evaluate(f"performance.getEntriesByName('{mark}')[0].startTime")
