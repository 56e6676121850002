"""Shared test fixtures: the real application, in-process, on a real database.

The backend comes from ``ALLOTMENT_TEST_BACKEND`` (``sqlite`` by default,
``postgresql`` or ``mysql``), so CI runs the same suite once per backend.
PostgreSQL and MariaDB tests use a database created for the session (and
dropped after); tables are emptied between tests, keeping the standard
resource classes and traits.

``api`` drives the WSGI app with WebOb's in-process requests: the whole
pipeline (microversions, noauth2, policy, schemas) runs, only the socket is
skipped.  HTTP-over-sockets and multi-process behaviour is covered by the
tests that start ``allotment serve``.
"""

from __future__ import annotations

import json as jsonlib
import logging
import os
import uuid as uuidlib

import pytest
import sqlalchemy as sa
import webob


@pytest.fixture(autouse=True)
def _isolated_logging():
    """Give every test the root logger as it found it: a test that runs a
    command in-process sets logging up once per process (service.setup_logging),
    and its stderr handler would otherwise write into the captured stderr of
    whichever test comes next in the same worker."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configured = getattr(root, "_allotment_configured", None)
    yield
    # oslo.log's set-up replaces the root's handlers: put back exactly those found.
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    if configured is None:
        root.__dict__.pop("_allotment_configured", None)
    else:
        root._allotment_configured = configured  # type: ignore[attr-defined]

BACKEND = os.environ.get("ALLOTMENT_TEST_BACKEND", "sqlite")


def pytest_configure(config):
    """Name the run (the xdist workers inherit the name): tests/deployment
    shares one installed venv between them under it."""
    if not hasattr(config, "workerinput"):
        os.environ.setdefault("ALLOTMENT_TEST_RUN", uuidlib.uuid4().hex[:12])


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        import shutil
        import tempfile

        shutil.rmtree(os.path.join(tempfile.gettempdir(), f"allotment-deployment-{os.environ['ALLOTMENT_TEST_RUN']}"),
                      ignore_errors=True)
SERVER_URLS = {
    "postgresql": os.environ.get("ALLOTMENT_TEST_POSTGRESQL_URL",
                                 "postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"),
    "mysql": os.environ.get("ALLOTMENT_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/{name}"),
}


def _admin_url(template: str) -> str:
    return template.format(name="postgres" if template.startswith("postgresql") else "")


def pg_databases() -> set[str]:
    """The names of every database on the PostgreSQL test server."""
    admin = sa.create_engine(_admin_url(SERVER_URLS["postgresql"]))
    try:
        with admin.connect() as conn:
            return {row[0] for row in conn.exec_driver_sql("SELECT datname FROM pg_database")}
    finally:
        admin.dispose()


def create_database(tmp_path_factory, label: str = "t") -> tuple[str, callable]:
    """A fresh, empty database on the selected backend: (url, drop)."""
    if BACKEND == "sqlite":
        path = tmp_path_factory.mktemp("db") / f"{label}.sqlite"
        return f"sqlite:///{path}", lambda: None
    template = SERVER_URLS[BACKEND]
    name = f"allotment_{label}_{uuidlib.uuid4().hex[:10]}"
    admin = sa.create_engine(_admin_url(template), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if BACKEND == "postgresql":
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        else:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")

    def drop():
        with admin.connect() as conn:
            if BACKEND == "postgresql":
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()

    return template.format(name=name), drop


def make_conf(db_url: str, **overrides):
    """A ConfigOpts as ``placement.conf`` would give: noauth2, legacy policy."""
    from allotment import config

    conf = config.load(None, dev_defaults=True, args=[])
    config.allow_any_host(conf)  # as from a file, not the embedded default
    conf.set_override("connection", db_url, group="placement_database")
    conf.set_override("auth_strategy", "noauth2", group="api")
    for key, value in overrides.items():
        group, _, name = key.rpartition("__")
        conf.set_override(name, value, group=group or None)
    return conf


def prepare(url: str) -> None:
    """The schema at head and the standard names in the database of ``url``."""
    from allotment import service
    from allotment.db.engine import Database

    db = Database(url)
    service.prepare_database(db)
    db.dispose()


@pytest.fixture(scope="session")
def db_url(tmp_path_factory):
    url, drop = create_database(tmp_path_factory, "session")
    prepare(url)
    yield url
    drop()


def _empty_tables(engine) -> None:
    from allotment.db import tables

    order = ["allocations", "consumers", "consumer_types", "projects", "users",
             "resource_provider_traits", "resource_provider_aggregates", "placement_aggregates",
             "inventories"]
    with engine.begin() as conn:
        for name in order:
            conn.execute(tables.metadata.tables[name].delete())
        rp = tables.resource_providers
        # Children before parents: clear the links first.
        conn.execute(rp.update().values(parent_provider_id=None, root_provider_id=None))
        conn.execute(rp.delete())
        conn.execute(tables.resource_classes.delete().where(
            tables.resource_classes.c.id >= tables.CUSTOM_RESOURCE_CLASS_MIN_ID))
        conn.execute(tables.traits.delete().where(tables.traits.c.name.like("CUSTOM\\_%", escape="\\")))


@pytest.fixture
def app(db_url):
    from allotment.api.app import Application
    from allotment.service import database_from_config

    conf = make_conf(db_url)
    application = Application(conf, database_from_config(conf))
    _empty_tables(application.db.engine)
    yield application
    application.db.dispose()


class Response:
    """What a test looks at: status, headers, text and decoded JSON."""

    def __init__(self, webob_response: webob.Response):
        self.raw = webob_response
        self.status = webob_response.status_code
        self.headers = webob_response.headers
        self.text = webob_response.text if webob_response.body else ""

    @property
    def json(self):
        return jsonlib.loads(self.text)

    def error(self) -> dict:
        return self.json["errors"][0]

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.text[:300]}>"


class ApiClient:
    """Requests to the in-process application, as the admin unless told otherwise."""

    def __init__(self, application, version: str = "latest", token: str = "admin"):
        self.application = application
        self.version = version
        self.token = token

    def request(self, method: str, path: str, *, json=None, body: bytes | None = None,
                version: str | None = None, headers: dict | None = None,
                token: str | None = None) -> Response:
        req = webob.Request.blank(path, method=method)
        req.headers["Accept"] = "application/json"
        effective_token = self.token if token is None else token
        if effective_token:
            req.headers["X-Auth-Token"] = effective_token
        chosen = self.version if version is None else version
        if chosen:
            req.headers["OpenStack-API-Version"] = f"placement {chosen}"
        if json is not None:
            req.body = jsonlib.dumps(json).encode()
            req.content_type = "application/json"
        elif body is not None:
            req.body = body
        for key, value in (headers or {}).items():
            if value is None:
                req.headers.pop(key, None)
            else:
                req.headers[key] = value
        return Response(req.get_response(self.application))

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, json=None, **kw):
        return self.request("POST", path, json=json, **kw)

    def put(self, path, json=None, **kw):
        return self.request("PUT", path, json=json, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)


@pytest.fixture
def api(app):
    return ApiClient(app)


def new_uuid() -> str:
    return str(uuidlib.uuid4())


def pg_statements_sent(engine) -> list[str]:
    """Every message of statements ``engine`` sends to PostgreSQL from now
    on, as sent (a transaction's ``BEGIN`` goes with its first statement),
    however it is sent (SQLAlchemy or the DBAPI cursor): its pooled
    connections are made again, each cursor noting what it ran."""
    import psycopg2.extensions
    import sqlalchemy as sa

    sent: list[str] = []

    def noting(dbapi_conn, _record):
        class Noting(dbapi_conn.cursor_factory or psycopg2.extensions.cursor):
            def execute(self, query, vars=None):
                try:
                    return super().execute(query, vars)
                finally:
                    if self.query is not None:
                        sent.append(self.query.decode())

        dbapi_conn.cursor_factory = Noting

    sa.event.listen(engine, "connect", noting)
    engine.dispose()
    return sent
