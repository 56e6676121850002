"""``allotment explain``: why ``GET /allocation_candidates`` finds what it
finds (or nothing) for a query string.

    allotment explain 'resources=VCPU:4,MEMORY_MB:2048&required=HW_CPU_X86_AVX512F'
    allotment explain --url http://placement:8778 --token "$OS_AUTH_TOKEN" '...' --json

Without ``--url`` it reads the configured database in-process, through the
direct interface (no API server needed, nothing written); with ``--url``
it asks a running server's ``GET /allotment/explain``.  Either way the
answer comes from the same engine; ``--json`` prints it as the endpoint
returns it, otherwise as a short report for the terminal.

Exit status: 0 when the request was explained (whatever it found); 1 when
the API refused the query (its 400 is printed, exactly as ``GET
/allocation_candidates`` would give it); 2 when the database or server
cannot be reached or the configuration names no database.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO
from urllib.parse import urlsplit

from allotment.cli import common
from allotment.cli.reshape import print_errors

DEFAULT_MICROVERSION = "1.39"
PATH = "/allotment/explain"
LABEL_WIDTH = 64


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", metavar="QUERY",
                        help="the query string of GET /allocation_candidates, e.g. "
                             "'resources=VCPU:4&required=HW_CPU_X86_AVX2' (a whole URL or path is fine too)")
    common.add_config_arguments(parser)
    parser.add_argument("--microversion", default=DEFAULT_MICROVERSION,
                        help=f"placement microversion the query is read at (default {DEFAULT_MICROVERSION})")
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON")
    parser.add_argument("--url", metavar="URL",
                        help="ask the Allotment server at this address (e.g. http://placement:8778) "
                             "instead of reading the database")
    parser.add_argument("--token", metavar="TOKEN",
                        help="X-Auth-Token for --url (default: $OS_AUTH_TOKEN)")


def query_of(text: str) -> str:
    """The query string of what the operator pasted: a query, a path or a URL."""
    text = text.strip()
    if "?" in text:
        return text.split("?", 1)[1]
    return text


def run(args: argparse.Namespace) -> int:
    query = query_of(args.query)
    try:
        response = _ask_server(args, query) if args.url else _ask_database(args, query)
    except _Unreachable as error:
        print(f"allotment explain: {error}", file=sys.stderr)
        return 2
    if response.status_code != 200:
        return _refused(response)
    body = response.json()
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        render(body)
    return 0


class _Unreachable(Exception):
    """The database or the server could not be asked."""


def _ask_server(args: argparse.Namespace, query: str):
    import requests

    parts = urlsplit(args.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _Unreachable(f"--url must be an http(s) address, got {args.url!r}")
    headers = {"Accept": "application/json", "OpenStack-API-Version": f"placement {args.microversion}"}
    token = args.token or os.environ.get("OS_AUTH_TOKEN")
    if token:
        headers["X-Auth-Token"] = token
    try:
        return requests.get(args.url.rstrip("/") + PATH + "?" + query, headers=headers, timeout=120)
    except requests.RequestException as error:
        raise _Unreachable(f"cannot reach {args.url}: {error}") from None


def _ask_database(args: argparse.Namespace, query: str):
    import sqlalchemy

    from allotment.direct import Direct

    # No embedded default: explaining a private, empty SQLite file would
    # answer "no trees" about the wrong cloud.
    conf = common.load_quietly(args)
    try:
        with Direct(conf, microversion=args.microversion, migrate=False) as client:
            return client.get(PATH + "?" + query)
    except sqlalchemy.exc.SQLAlchemyError as error:
        detail = getattr(error, "orig", None) or error
        raise _Unreachable(f"cannot read the database: {str(detail).splitlines()[0]}") from None


def _refused(response: Any) -> int:
    print(f"{response.status_code} {response.reason}", file=sys.stderr)
    print_errors(response, sys.stderr)
    return 1


# ---------------------------------------------------------------------------
# The terminal report
# ---------------------------------------------------------------------------

def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _number(value: int | None) -> str:
    return "" if value is None else str(value)


def _who(provider: dict | None) -> str:
    if not provider:
        return ""
    return provider.get("name") or provider.get("uuid") or ""


def render(body: dict, out: TextIO | None = None) -> None:
    """The explanation as a short report: the verdict, the funnel, the near misses."""
    out = out or sys.stdout
    write = lambda line="": print(line, file=out)  # noqa: E731
    write(body["verdict"])
    write()
    found = body["candidates"]
    cut = ""
    if found["limited"]:
        cut = f", cut by limit={found['limit']}"
    elif found["capped"]:
        cut = f", counting stopped at the {found['cap_source']} of {found['cap']}"
    available = f"{found['available']}{'+' if found['capped'] else ''}"
    write(f"candidates: {found['returned']} returned of {available}{cut}, from {found['trees']} trees")
    cloud = body["cloud"]
    write(f"cloud: {cloud['trees']} trees, {cloud['providers']} providers"
          f" (microversion {body.get('microversion', '?')}, {body.get('elapsed_ms', '?')} ms)")
    write()
    steps = body["steps"]
    width = min(LABEL_WIDTH, max(len(step["label"]) + 2 for step in steps))
    width = max(width, len("filter"))
    write(f"{'':{width}}  {'providers':>15}  {'trees':>15}")
    write(f"{'filter':{width}}  {'left':>7} {'out':>7}  {'left':>7} {'out':>7}")
    heading = None
    for step in steps:
        indent = ""
        if step["scope"] == "providers":
            this = (step["group"], step["resource_class"])
            if this != heading:
                heading = this
                group = "the unsuffixed group" if step["group"] == "" else f"group {step['group']}"
                write(group + (f", {step['resource_class']}" if step["resource_class"] else ""))
            indent = "  "
        elif heading is not None:
            if heading != "request":
                heading = "request"
                write("the whole request")
            indent = "  "
        providers = step["providers"] or {}
        trees = step["trees"]
        out_trees = "" if step["filter"] == "cloud" else _number(trees["eliminated"])
        write(f"{_cut(indent + step['label'], width):{width}}  {_number(providers.get('left')):>7} "
              f"{_number(providers.get('eliminated')):>7}  {_number(trees['left']):>7} {out_trees:>7}")
    if body["closest"]:
        write()
        write("closest (fewest problems first):")
        for near in body["closest"]:
            count = near["lacks"]
            write(f"  {_who(near['tree'])}  ({count} problem{'s' if count != 1 else ''})")
            for problem in near["problems"]:
                who = _who(problem["provider"])
                write(f"    {who + ': ' if who else ''}{problem['text']}")
    for note in body.get("notes", ()):
        write(f"note: {note}")

