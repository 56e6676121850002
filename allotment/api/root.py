"""``GET /``: the version document, readable without a token."""

from __future__ import annotations

from allotment.api.http import Request, json_response
from allotment.api.microversion import MAX_VERSION, MIN_VERSION


def home(req: Request):
    body = {
        "versions": [{
            "id": "v1.0",
            "max_version": str(MAX_VERSION),
            "min_version": str(MIN_VERSION),
            "status": "CURRENT",
            "links": [{"rel": "self", "href": ""}],
        }]
    }
    return json_response(req, body)
