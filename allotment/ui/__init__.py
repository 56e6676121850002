"""The capacity view: a web page for operators, shipped inside the package.

``static/`` holds the whole page: ``index.html``, ``app.js`` (vanilla
JavaScript, no build step, no library) and ``app.css``.  ``allotment serve``
serves them at ``/allotment/ui`` when ``[allotment] ui`` is on
(:mod:`allotment.api.ui`); the page reads only Allotment's own HTTP API
(Placement's routes and ``/allotment/capacity...``, ``/allotment/explain``)
with the token the operator types in, kept in the browser tab's
``sessionStorage``.
"""

from __future__ import annotations

import functools
from importlib import resources

#: URL name -> (file in static/, content type).
ASSETS = {
    "": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/app.css": ("app.css", "text/css; charset=utf-8"),
}


@functools.lru_cache(maxsize=None)
def read(name: str) -> bytes:
    """The bytes of one file of ``static/``."""
    return resources.files(__name__).joinpath("static", name).read_bytes()
