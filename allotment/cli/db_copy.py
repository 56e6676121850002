"""``allotment db copy``: a whole Placement database into an empty one, verified.

The work is :mod:`allotment.db.copy`'s; this module reads the arguments,
draws the progress (a bar per table on a terminal, one line per table
otherwise, both on stderr) and prints the verification table on stdout.

Exit status: 0 when the copy was committed and every count and checksum
matched; 1 when it was refused, failed, was interrupted or did not verify
(the target is then left as it was found); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import TextIO

from allotment.cli import common
from allotment.db import copy as db_copy

BAR_WIDTH = 24
#: Redraw a bar at most this often (seconds).
REDRAW_EVERY = 0.1
DONE = {"copy": "copied", "verify": "verified"}


HELP = ("copy a whole Placement database into an empty one (SQLite, PostgreSQL, MariaDB/MySQL), "
        "verified by row counts and checksums")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", metavar="URL",
                        help="the database to copy (default: [placement_database] connection of the "
                             "configuration file)")
    parser.add_argument("--to", dest="target", metavar="URL", required=True,
                        help="the empty database to copy into (sqlite:///PATH, "
                             "postgresql://USER:PASS@HOST/NAME, mysql+pymysql://USER:PASS@HOST/NAME)")
    parser.add_argument("--batch-size", type=int, default=db_copy.DEFAULT_BATCH_SIZE, metavar="N",
                        help=f"rows per read and insert (default {db_copy.DEFAULT_BATCH_SIZE})")
    parser.add_argument("--verify-only", action="store_true",
                        help="copy nothing: compare the counts and checksums of an earlier copy with "
                             "the source")


class Bar:
    """One line per table, redrawn in place: name, bar, rows/total, rows per second."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def start(self, table: str, total: int, phase: str = "copy") -> None:
        self.table, self.total, self.done, self.phase = table, total, 0, phase
        self.began = self.drawn = time.monotonic()
        self._draw()

    def advance(self, rows: int) -> None:
        self.done += rows
        if time.monotonic() - self.drawn >= REDRAW_EVERY:
            self._draw()

    def finish(self) -> None:
        self._draw()
        self.stream.write("\n")
        self.stream.flush()

    def _rate(self) -> float:
        return self.done / max(time.monotonic() - self.began, 1e-6)

    def _draw(self) -> None:
        self.drawn = time.monotonic()
        filled = BAR_WIDTH if not self.total else BAR_WIDTH * self.done // self.total
        self.stream.write(f"\r{self.phase:<6} {self.table:<28} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                          f"{self.done:>9}/{self.total:<9} {self._rate():>9.0f} rows/s")
        self.stream.flush()


class Lines(Bar):
    """Not a terminal: a plain line when each table is done."""

    def start(self, table: str, total: int, phase: str = "copy") -> None:
        self.table, self.total, self.done, self.phase = table, total, 0, phase
        self.began = time.monotonic()

    def advance(self, rows: int) -> None:
        self.done += rows

    def finish(self) -> None:
        seconds = time.monotonic() - self.began
        self.stream.write(f"{DONE[self.phase]} {self.table}: {self.done} rows in {seconds:.1f} s "
                          f"({self._rate():.0f} rows/s)\n")
        self.stream.flush()


def progress_for(stream: TextIO) -> Bar:
    return Bar(stream) if stream.isatty() else Lines(stream)


def print_checks(outcome: db_copy.Outcome, out: TextIO) -> None:
    print(f"{'table':<28} {'source rows':>12} {'target rows':>12}  {'checksum (sha256)':<18} result",
          file=out)
    for check in outcome.checks:
        shown = check.source_sum[:16] if check.ok else f"{check.source_sum[:7]}/{check.target_sum[:7]}"
        print(f"{check.table:<28} {check.source_rows:>12} {check.target_rows:>12}  {shown:<18} "
              f"{'ok' if check.ok else 'MISMATCH'}", file=out)
    for label, source, target in zip(("Placement schema", "Allotment revision"),
                                     outcome.source_versions, outcome.target_versions):
        print(f"{label:<28} {str(source):>12} {str(target):>12}  {'':<18} "
              f"{'ok' if source == target else 'MISMATCH'}", file=out)


def _source_url(args) -> str:
    if args.source:
        return args.source
    from allotment import service

    return service.database_from_config(common.load(args)).url


def run(args, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    if args.source and (args.config_files or args.config_dirs):
        print("allotment db copy: give --from or --config-file/--config-dir, not both", file=out)
        return 2
    if args.batch_size < 1:
        print("allotment db copy: --batch-size must be a positive number of rows", file=out)
        return 2
    # Alembic's notes on laying out the target would break into the bar.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    started = time.monotonic()
    try:
        source = _source_url(args)
        if args.verify_only:
            outcome = db_copy.verify(source, args.target, batch_size=args.batch_size)
        else:
            outcome = db_copy.copy(source, args.target, batch_size=args.batch_size,
                                   progress=progress_for(err))
    except db_copy.CopyError as error:
        print(f"allotment db copy: {error}", file=out)
        return 1
    except common.schema_errors() as error:
        print(f"allotment db copy: {common.one_line(error)}; the target was left as it was", file=out)
        return 1
    except KeyboardInterrupt:
        print("\nallotment db copy: interrupted; the target was left as it was found "
              "(on MariaDB/MySQL perhaps with empty tables): run the copy again", file=out)
        return 1
    seconds = time.monotonic() - started
    print_checks(outcome, out)
    if not outcome.ok:
        bad = [check.table for check in outcome.checks if not check.ok]
        what = ", ".join(bad) if bad else "schema versions"
        if args.verify_only:
            print(f"verification FAILED ({what}): the target is not a copy of the source as it is now",
                  file=out)
        else:
            print(f"verification FAILED ({what}): nothing was committed, the target was left as it "
                  "was", file=out)
        return 1
    tables = len(outcome.checks)
    if args.verify_only:
        print(f"verified {tables} tables, {outcome.rows} rows in {seconds:.1f} s: every count and "
              "checksum matches", file=out)
    else:
        print(f"copied {tables} tables, {outcome.rows} rows in {seconds:.1f} s; every count and "
              "checksum matches", file=out)
    return 0
