"""The request id: made once per request, sent back in a header, logged.

Every response carries ``x-openstack-request-id`` (:data:`REQUEST_ID_HEADER`); the
application makes the id, and so do the answers given before a request
reaches it (the server's refusals, the WSGI entry's 503 while the database
cannot be served), all with :func:`new_request_id`.
"""

from __future__ import annotations

import os
import re

REQUEST_ID_HEADER = "x-openstack-request-id"
#: An incoming ``X-OpenStack-Request-ID`` of this form becomes the request's
#: global request id (as oslo.middleware's RequestId takes it); others are ignored.
GLOBAL_REQUEST_ID = re.compile(r"req-[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}")


def new_request_id() -> str:
    """``req-`` and a random (version 4) UUID, as ``str(uuid.uuid4())``
    spells it, for a third of the cost: its version and variant digits
    set in the text."""
    h = os.urandom(16).hex()
    return f"req-{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"
