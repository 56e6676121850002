"""``allotment openapi``: write the OpenAPI 3.1 document of one microversion.

The same document ``GET /allotment/openapi.json`` serves, generated from
the route table and the schemas the server validates with; no
configuration or database is needed.  ``--microversion`` picks the version
(default: the latest); ``--output`` a file instead of standard output.
"""

from __future__ import annotations

import argparse
import json
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--microversion", default="latest", metavar="1.X",
                        help="the microversion to describe (default: latest)")
    parser.add_argument("--output", "-o", metavar="FILE", help="write here instead of standard output")


def run(args) -> int:
    from allotment.api import openapi, routes

    try:
        version = openapi.parse_version(args.microversion)
    except ValueError as error:
        print(f"allotment openapi: {error}", file=sys.stderr)
        return 2
    text = json.dumps(openapi.document(routes.TABLE, version), indent=2) + "\n"
    if not args.output:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as output:
            output.write(text)
    except OSError as error:
        print(f"allotment openapi: cannot write {args.output}: {error.strerror}", file=sys.stderr)
        return 2
    return 0

