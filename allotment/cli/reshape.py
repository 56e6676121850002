"""``allotment reshape``: one POST /reshaper through the direct interface.

For operators and offline upgrade scripts: with every API process stopped,
``allotment reshape --config-file /etc/placement/placement.conf
payload.json`` applies the reshape in ``payload.json`` (``-`` reads standard
input) to the configured database, with exactly the validation, policy and
generation checks the API applies, and says what happened.

Exit status: 0 when the reshape was applied; 1 when the API refused it (the
status, error code and detail are printed, so a 409
``placement.concurrent_update`` tells the operator to re-read and rebuild the
payload); 2 when the payload file cannot be read or is not JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from allotment.cli import common

DEFAULT_MICROVERSION = "1.30"


def configure(parser: argparse.ArgumentParser) -> None:
    common.add_config_arguments(parser)
    parser.add_argument("payload", metavar="PAYLOAD.json",
                        help="the POST /reshaper body ('-' for standard input)")
    parser.add_argument("--microversion", default=DEFAULT_MICROVERSION,
                        help=f"placement microversion of the request (default {DEFAULT_MICROVERSION}; "
                             "1.34 accepts mappings, 1.38 requires consumer_type)")


def _read_payload(name: str) -> Any:
    if name == "-":
        return json.load(sys.stdin)
    with open(name, encoding="utf-8") as handle:
        return json.load(handle)


def report(response: Any, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print what the API answered; the process exit status for it."""
    out = out or sys.stdout
    err = err or sys.stderr
    status = f"{response.status_code} {response.reason}"
    if response.status_code == 204:
        print(f"{status}: reshape applied", file=out)
        return 0
    print(f"{status}: reshape refused", file=err)
    print_errors(response, err)
    return 1


def print_errors(response: Any, err: TextIO) -> None:
    """Each error of an API error response, its code and the specific
    sentence of its detail, one line each."""
    try:
        errors = response.json()["errors"]
    except (ValueError, KeyError, TypeError):
        errors = [{"detail": response.text}]
    for error in errors:
        detail = _essential(str(error.get("detail", "")))
        code = error.get("code")
        print(f"  {code}: {detail}" if code else f"  {detail}", file=err)


def _essential(detail: str) -> str:
    """The specific sentence of an error detail, on one line.

    A detail is the status's generic explanation, a blank line, then the
    message (whose own later paragraphs, such as jsonschema's dump of the
    schema, help nobody at a terminal).
    """
    paragraphs = [part.strip() for part in detail.split("\n\n") if part.strip()]
    if len(paragraphs) > 1:
        paragraphs = paragraphs[1:]
    return " ".join(paragraphs[0].split()) if paragraphs else ""


def run(args: argparse.Namespace) -> int:
    from allotment.direct import Direct

    try:
        payload = _read_payload(args.payload)
    except (OSError, ValueError) as error:
        print(f"allotment reshape: cannot read {args.payload}: {error}", file=sys.stderr)
        return 2
    # No embedded default here: reshaping a private SQLite file by mistake
    # would report success and change nothing that matters.
    # (Only warnings reach stderr unless the file asks for logging: the result is the output.)
    conf = common.load_quietly(args)
    with Direct(conf, microversion=args.microversion) as client:
        response = client.post("/reshaper", json=payload)
    return report(response)

