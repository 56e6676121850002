"""Write a synthetic cloud straight into an empty database, in Placement
16.0.0's layout, then let Allotment take it over (as ``allotment db sync``).

    tools/cloudgen --db-url sqlite:////tmp/big.sqlite nested=100000
    tools/cloudgen --db-url postgresql+psycopg2://postgres@127.0.0.1:5432/big flat=10000 sharing=2000
    tools/cloudgen --db-url ... --seed 7 --placement-only --summary out.json nested=200

Each argument is SHAPE=ROOTS (shapes: flat, nested, sharing; see
tools/cloudgen/cloud.py for what each holds).  A PostgreSQL or MySQL
database named in the URL is created when it does not exist; it must be
empty.  ``--placement-only`` leaves the database as a Placement 16.0.0
deployment would hold it (Allotment's bookkeeping tables and triggers are
made by the first ``allotment db sync`` or ``allotment serve``).
``--summary`` writes what was generated (counts, aggregates, projects,
each project's usage, some root uuids) as JSON.

Run it with the project's venv: ``.venv/bin/python tools/cloudgen ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import sqlalchemy as sa  # noqa: E402

from cloud import SHAPES, Spec, generate  # noqa: E402


def create_database(url: str) -> None:
    """Create the PostgreSQL or MySQL database ``url`` names, unless it exists."""
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return
    name = parsed.database
    admin = sa.create_engine(parsed.set(database="postgres" if backend == "postgresql" else ""),
                             isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if backend == "postgresql":
                if not conn.exec_driver_sql("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).first():
                    conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            else:
                conn.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS `{name}` "
                                     "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    finally:
        admin.dispose()


def parse_shapes(items: list[str]) -> list[tuple[str, int]]:
    shapes = []
    for item in items:
        shape, _, roots = item.partition("=")
        if shape not in SHAPES or not roots.isdigit():
            raise SystemExit(f"cloudgen: expected SHAPE=ROOTS with SHAPE one of {', '.join(SHAPES)}, got {item!r}")
        shapes.append((shape, int(roots)))
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/cloudgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="+", metavar="SHAPE=ROOTS")
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--full-first", type=float, default=0.0, metavar="SHARE",
                        help="this share of each shape's first roots full, as a cloud that fills in the "
                             "order candidates are given (default 0)")
    parser.add_argument("--placement-only", action="store_true",
                        help="leave the database as Placement 16.0.0 would (no take-over by Allotment)")
    parser.add_argument("--summary", help="write what was generated to this JSON file")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    spec = Spec(parse_shapes(args.shapes), seed=args.seed, full_first=args.full_first)
    create_database(args.db_url)
    log = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr))
    result = generate(args.db_url, spec, placement_only=args.placement_only, log=log)
    for summary in result.shapes:
        print(f"{summary.shape}: {summary.roots} roots, {summary.providers} providers, "
              f"{summary.inventories} inventories, {summary.consumers} consumers, "
              f"{summary.allocations} allocations, {len(summary.aggregates)} aggregates")
    print(f"rows: {sum(result.rows.values())} in {result.seconds:.1f} s"
          + ("" if result.taken_over else " (Placement layout only: not taken over)"))
    if args.summary:
        with open(args.summary, "w") as out:
            json.dump({"seed": args.seed, "seconds": result.seconds, "rows": result.rows,
                       "shapes": [dataclasses.asdict(s) for s in result.shapes]}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
