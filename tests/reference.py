"""The reference Placement (openstack-placement 16.0.0), used only as a yardstick.

The suite itself never needs it: ``create_from_ddl`` builds a database at
any of its schema revisions from the DDL stored under
``tests/data/reference_ddl`` (``tools/reference_schema_ddl`` wrote it once by
running the reference's own migrations).  Opt-in tests
(``ALLOTMENT_REFERENCE_TESTS=1``), ``tools/reference_schema*`` and the
mixed-fleet test drive the reference as an external program from its cache
venv (``shared/reference/serve`` builds it): its migrations, its
``placement-manage`` and its API.  Nothing here imports it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid as uuidlib

import sqlalchemy as sa

#: The reference's schema revisions, oldest first (Stein .. 16.0.0).
REVISIONS = ["b4ed3a175331", "611cd6dffd7b", "b5c396305c25", "422ece571366", "a082b8bb98d0"]
HEAD = REVISIONS[-1]
SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "data", "reference_schema.json")
DDL_DIR = os.path.join(os.path.dirname(__file__), "data", "reference_ddl")
SERVE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "reference",
                                     "serve"))
SERVER_URLS = {
    "postgresql": os.environ.get("ALLOTMENT_TEST_POSTGRESQL_URL",
                                 "postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"),
    "mysql": os.environ.get("ALLOTMENT_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/{name}"),
}


def venv() -> str | None:
    """The reference's venv, or None when it was never built here."""
    home = os.environ.get("PLACEMENT_REFERENCE_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "placement-reference")
    path = os.path.join(home, "venv")
    if os.access(os.path.join(path, "bin", "placement-manage"), os.X_OK):
        return path
    return None


def ensure_venv() -> str | None:
    """The venv, built first (by ``shared/reference/serve``, from PyPI) when missing under CI."""
    if venv() is not None or os.environ.get("CI") != "true" or serve_script() is None:
        return venv()
    import fcntl

    lock_path = os.path.join(os.path.expanduser("~"), ".allotment-reference-build.lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder among the test workers
        if venv() is None:
            # Without arguments the script builds its venv, then stops on the
            # missing --config-file (exit 2).
            subprocess.run([serve_script()], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=900)
    return venv()


def serve_script() -> str | None:
    for candidate in (os.environ.get("PLACEMENT_REFERENCE_SERVE"), SERVE,
                      "/work/shared/reference/serve"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def scratch_database(backend: str, label: str, directory: str | None = None):
    """An empty database as an operator would create it for Placement: (url, drop).

    On MariaDB it gets the server's default character set and collation,
    as a plain ``CREATE DATABASE placement`` does.
    """
    name = f"allotment_{label}_{uuidlib.uuid4().hex[:8]}"
    if backend == "sqlite":
        import tempfile

        path = os.path.join(directory or tempfile.mkdtemp(prefix="allotment-ref-"), f"{name}.sqlite")
        return f"sqlite:///{path}", lambda: os.path.exists(path) and os.unlink(path)
    template = SERVER_URLS[backend]
    admin = sa.create_engine(template.format(name="postgres" if backend == "postgresql" else ""),
                             isolation_level="AUTOCOMMIT")
    quoted = f'"{name}"' if backend == "postgresql" else f"`{name}`"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {quoted}")

    def drop():
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}"
                                 + (" WITH (FORCE)" if backend == "postgresql" else ""))
        admin.dispose()

    return template.format(name=name), drop


def reference_url(url: str) -> str:
    """Our SQLAlchemy URL as the reference's (oslo.db) configuration takes it."""
    return url.replace("+psycopg2", "").replace("postgresql://", "postgresql+psycopg2://")


# Run inside the reference's venv: configure its database layer the way its
# command line does, then run its Alembic migrations up to one revision.
_SYNC = """
import sys
from oslo_config import cfg
from placement import conf, db_api
from placement.db.sqlalchemy import migration
config = cfg.ConfigOpts()
conf.register_opts(config)
config(["--config-file", sys.argv[1]], project="placement", default_config_files=[])
db_api.configure(config)
migration.upgrade(sys.argv[2])
"""


def sync(url: str, revision: str = "head") -> None:
    """Migrate ``url`` with the reference's own migrations up to ``revision``."""
    import tempfile

    path = venv()
    if path is None:
        raise RuntimeError("the reference's venv is missing")
    with tempfile.TemporaryDirectory() as directory:
        conf_path = write_conf(directory, url)
        done = subprocess.run([os.path.join(path, "bin", "python"), "-c", _SYNC, conf_path, revision],
                              capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"reference migration to {revision} failed: {done.stderr[-2000:]}")


def write_conf(directory: str, url: str) -> str:
    """A placement.conf for the reference (noauth2) on ``url``; returns its path."""
    os.makedirs(directory, exist_ok=True)
    conf_path = os.path.join(directory, "placement.conf")
    with open(conf_path, "w") as handle:
        handle.write(f"[DEFAULT]\n[api]\nauth_strategy = noauth2\n"
                     f"[placement_database]\nconnection = {reference_url(url)}\n")
    return conf_path


def manage(conf_path: str, *args: str) -> subprocess.CompletedProcess:
    """``placement-manage --config-file CONF ARGS...`` (not checked)."""
    return subprocess.run([os.path.join(venv(), "bin", "placement-manage"), "--config-file", conf_path,
                           *args], capture_output=True, text=True, timeout=300)


def reflect(url: str) -> dict:
    """Schema facts of every table, as comparable plain data."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        facts = {}
        for table in sorted(inspector.get_table_names()):
            facts[table] = {
                "columns": {c["name"]: {"type": _type_name(c["type"]), "nullable": c["nullable"]}
                            for c in inspector.get_columns(table)},
                "primary_key": inspector.get_pk_constraint(table)["constrained_columns"],
                "indexes": {i["name"]: {"columns": i["column_names"], "unique": bool(i["unique"])}
                            for i in inspector.get_indexes(table)},
                "unique_constraints": {u["name"]: u["column_names"]
                                       for u in inspector.get_unique_constraints(table)},
                "foreign_keys": sorted(
                    [{"name": f["name"], "columns": f["constrained_columns"],
                      "referred": f"{f['referred_table']}({','.join(f['referred_columns'])})"}
                     for f in inspector.get_foreign_keys(table)],
                    key=lambda f: (f["columns"], f["referred"])),
            }
        return facts
    finally:
        engine.dispose()


def missing_facts(expected: dict, found: dict) -> list[str]:
    """What the ``reflect`` facts ``expected`` have that ``found`` lacks, as readable lines.

    Additions in ``found`` are allowed; anything missing, renamed or retyped
    is listed (the reference could not use such a database).
    """
    missing = []
    for table, facts in expected.items():
        have = found.get(table)
        if have is None:
            missing.append(f"table {table}")
            continue
        for column, spec in facts["columns"].items():
            if have["columns"].get(column) != spec:
                missing.append(f"column {table}.{column} {spec} (found {have['columns'].get(column)})")
        if have["primary_key"] != facts["primary_key"]:
            missing.append(f"primary key of {table} {facts['primary_key']}")
        for kind in ("indexes", "unique_constraints"):
            for name, spec in facts[kind].items():
                if have[kind].get(name) != spec:
                    missing.append(f"{kind} {table}.{name} {spec} (found {have[kind].get(name)})")
        for key in facts["foreign_keys"]:
            # SQLite reflection names only table-level constraints: a column-level
            # "CONSTRAINT name REFERENCES" (what ALTER TABLE ADD COLUMN can add) comes
            # back unnamed.  PostgreSQL and MariaDB always name theirs.
            if not any(have_key == key or (have_key["name"] is None and
                                           {**have_key, "name": key["name"]} == key)
                       for have_key in have["foreign_keys"]):
                missing.append(f"foreign key {table} {key}")
    return missing


def _type_name(type_) -> str:
    name = type(type_).__name__.upper()
    length = getattr(type_, "length", None)
    return f"{name}({length})" if length else name


def ddl_statements(backend: str, revision: str) -> list[str]:
    """The stored statements that make the reference's database at ``revision`` on ``backend``."""
    with open(os.path.join(DDL_DIR, backend, f"{revision}.sql")) as handle:
        text = "\n".join(line for line in handle.read().splitlines() if not line.startswith("--"))
    return [part.strip() for part in re.split(r";\s*\n", text) if part.strip()]


def create_from_ddl(url: str, revision: str) -> None:
    """Lay out the empty database ``url`` as the reference's migrations left it at ``revision``."""
    engine = sa.create_engine(url)
    backend = engine.dialect.name
    try:
        with engine.begin() as conn:
            if backend == "mysql":
                conn.exec_driver_sql("SET SESSION foreign_key_checks = 0")
            for statement in ddl_statements(backend, revision):
                conn.exec_driver_sql(statement.replace("%", "%%") if backend != "sqlite" else statement)
    finally:
        engine.dispose()


def load_schema() -> dict:
    with open(SCHEMA_FILE) as handle:
        return json.load(handle)


def free_port() -> int:
    """A free local port: from ``ALLOTMENT_TEST_PORTS`` (``LOW-HIGH``) when set, else any."""
    import socket

    span = os.environ.get("ALLOTMENT_TEST_PORTS")
    candidates = range(*(lambda low, high: (int(low), int(high) + 1))(*span.split("-"))) if span else [0]
    import random

    candidates = list(candidates)
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError("no free port")


class Server:
    """The reference's API (``shared/reference/serve``) on one database, stopped on exit."""

    def __init__(self, url: str, directory: str, *, workers: int = 1):
        from pathlib import Path

        from tests.functional.test_server import LiveServer, clean_env

        port = free_port()
        conf_path = write_conf(directory, url)
        self.live = LiveServer([serve_script(), "--config-file", conf_path, "--port", str(port),
                                "--workers", str(workers)],
                               port, Path(directory) / "reference.log", env=clean_env())
        self.base = self.live.url
        try:
            self.live.wait_ready(timeout=90)
        except BaseException:
            self.live.stop()
            raise

    def get(self, path: str, version: str = "latest"):
        import requests

        return requests.get(self.base + path, timeout=30, headers={
            "X-Auth-Token": "admin", "Accept": "application/json",
            "OpenStack-API-Version": f"placement {version}"})

    def stop(self) -> None:
        self.live.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
