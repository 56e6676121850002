"""Configuration: the ``placement.conf`` groups and option names operators know.

Options are registered with oslo.config under upstream Placement's group and
option names so that an existing ``placement.conf`` works unchanged.  Groups
owned by libraries (``[oslo_policy]``, ``[cors]``, ``[keystone_authtoken]``)
are registered by those libraries when they are loaded.

Only the embedded default differs from upstream: when no file at all is
found, ``allotment serve`` uses a SQLite file and noauth2 on the loopback
address so that a first run needs no set-up (see ``dev_defaults``).
"""

from __future__ import annotations

import os

from oslo_config import cfg

DEFAULT_CONFIG_NAME = "placement.conf"
DEFAULT_CONFIG_DIR = "/etc/placement"

api_opts = [
    cfg.StrOpt(
        "auth_strategy",
        default="keystone",
        choices=[
            ("keystone", "Authenticate with keystonemiddleware auth_token."),
            ("noauth2", "Trust the token; for testing only."),
        ],
        help="Which authentication middleware guards the API.",
    ),
]

#: The pool's size and overflow when ``placement.conf`` leaves them unset.
POOL_SIZE = 5
MAX_OVERFLOW = 50

database_opts = [
    cfg.StrOpt("connection", secret=True, help="SQLAlchemy URL of the placement database."),
    cfg.StrOpt("connection_parameters", default="",
               help="Extra query-string parameters appended to the connection URL."),
    cfg.BoolOpt("sqlite_synchronous", default=True,
                help="If False, SQLite does not wait for data to reach the disk (PRAGMA synchronous=OFF)."),
    cfg.StrOpt("slave_connection", secret=True,
               help="Accepted for compatibility; reads always use the main connection."),
    cfg.StrOpt("mysql_sql_mode", default="TRADITIONAL", help="SQL mode set on MySQL sessions."),
    cfg.IntOpt("connection_recycle_time", default=3600,
               help="Seconds after which a pooled connection is replaced."),
    cfg.IntOpt("max_pool_size", help="Connections kept open in the pool, per process (unset: "
                                      f"{POOL_SIZE})."),
    cfg.IntOpt("max_retries", default=10, help="Connection attempts at start-up (-1: forever)."),
    cfg.IntOpt("retry_interval", default=10, help="Seconds between connection attempts."),
    cfg.IntOpt("max_overflow", help=f"Connections allowed beyond max_pool_size (unset: {MAX_OVERFLOW})."),
    cfg.IntOpt("connection_debug", default=0, min=0, max=100, help="SQL logging verbosity."),
    cfg.BoolOpt("connection_trace", default=False, help="Accepted for compatibility."),
    cfg.IntOpt("pool_timeout", help="Seconds to wait for a pooled connection."),
    cfg.BoolOpt("sync_on_startup", default=False,
                help="Upstream runs db sync at start when set; allotment serve always does."),
]

placement_opts = [
    cfg.BoolOpt("randomize_allocation_candidates", default=False,
                help="Shuffle allocation candidates before applying limit."),
    cfg.StrOpt("incomplete_consumer_project_id", default="00000000-0000-0000-0000-000000000000",
               help="Project id recorded for consumers written before microversion 1.8."),
    cfg.StrOpt("incomplete_consumer_user_id", default="00000000-0000-0000-0000-000000000000",
               help="User id recorded for consumers written before microversion 1.8."),
    cfg.IntOpt("allocation_conflict_retry_count", default=10, min=0,
               help="Server-side retries of an allocation write that lost a generation race."),
    cfg.IntOpt("max_allocation_candidates", default=-1, min=-1,
               help="Most allocation candidates generated per request; -1 means no limit."),
    cfg.StrOpt("allocation_candidates_generation_strategy", default="depth-first",
               choices=[
                   ("depth-first", "Fill candidates from one root before the next."),
                   ("breadth-first", "Take candidates from every root in turn."),
               ],
               help="Which candidates survive when max_allocation_candidates cuts generation short."),
]

#: Not among Placement 16.0.0's options; the Galera change gives it its meaning.
galera_opts = [
    cfg.IntOpt("mysql_wsrep_sync_wait", min=0, max=15,
               help="Galera: wsrep_sync_wait set on every database session. 1 makes each read wait until "
                    "its node has applied everything the cluster committed before it, so a write through "
                    "one node is seen by the next read through any other (see "
                    "docs/high-availability.md). Unset: the server's own setting."),
]

#: Large enough for the largest POST /allocations or POST /reshaper a cloud
#: sends (a reshape moving 10,000 consumers is about 4 MB of JSON).
DEFAULT_MAX_REQUEST_BODY_SIZE = 16 * 1024 * 1024

#: Allotment's own options (not Placement's), in ``[allotment]``.
allotment_opts = [
    cfg.BoolOpt("metrics", default=False,
                help="Serve Prometheus metrics at GET /metrics (guarded by the policy rule allotment:metrics, "
                     "admin by default)."),
    cfg.BoolOpt("metrics_public", default=False,
                help="Serve GET /metrics to anyone who can reach the port, without a token or policy check "
                     "(for scrapers without keystone credentials)."),
    cfg.IntOpt("metrics_capacity_cache_seconds", default=10, min=0,
               help="Seconds the capacity gauges of GET /metrics are reused before the database is asked "
                    "again (one grouped query)."),
    cfg.BoolOpt("ui", default=False,
                help="Serve the capacity view, a web page for operators, at /allotment/ui, and its JSON at "
                     "/allotment/capacity... (guarded by the policy rule allotment:capacity, admin by "
                     "default). On in the embedded default, off unless set in a configuration file."),
    cfg.IntOpt("candidates_cache_mb", default=32, min=0,
               help="Memory (MiB of JSON, per worker process) for reusing answers of GET "
                    "/allocation_candidates while none of the tables they are computed from has changed "
                    "(checked on every request, whoever wrote; see docs/operations.md). 0 turns reuse off. Unused on "
                    "MySQL/MariaDB and with [placement] randomize_allocation_candidates."),
    cfg.BoolOpt("provider_mirror", default=True,
                help="Keep every resource provider in memory in each worker process, brought up to date at "
                     "each GET /allocation_candidates by reading again only the providers the database notes "
                     "as changed, whoever wrote (SQLite; see docs/operations.md). Off: each answer not reused reads "
                     "the providers it needs."),
    cfg.BoolOpt("pg_prepared_statements", default=True,
                help="PostgreSQL: plan the statements run on every request once per database connection "
                     "(server-side prepared statements). Turn off behind a connection pooler that does not "
                     "keep a session per client connection (PgBouncer in transaction or statement mode)."),
    cfg.BoolOpt("claims_together", default=False,
                help="PostgreSQL: commit the claims of new consumers (PUT /allocations/{consumer_uuid}) that "
                     "wait in one worker process at once in one transaction, as POST /allocations would; a "
                     "group that cannot commit is written claim by claim. No claim waits for others (see "
                     "docs/operations.md)."),
    cfg.IntOpt("max_request_body_size", default=DEFAULT_MAX_REQUEST_BODY_SIZE, min=1,
               help="Largest request body accepted, in bytes; a larger one is refused with 413 "
                    "before it is read."),
]

#: Placement registers these in ``[DEFAULT]`` (paths older OpenStack
#: services shared); nothing in Placement or Allotment reads them.
path_opts = [
    cfg.StrOpt("tempdir", help="Explicitly specify the temporary working directory."),
    cfg.StrOpt("pybasedir", default=os.path.abspath(os.path.join(os.path.dirname(__file__), "..")),
               sample_default="<Path>", help="Directory where the placement package is installed."),
    cfg.StrOpt("state_path", default="$pybasedir", help="Top-level directory for keeping state."),
]

workarounds_opts = [
    cfg.BoolOpt("optimize_for_wide_provider_trees", default=False,
                help="Placement's shortcut for trees with very many providers; Allotment's search "
                     "needs no such switch."),
]

#: Placement's own default for ``[cors]``: the headers its clients send and
#: read, and its methods (an operator's ``[cors]`` values win).
CORS_DEFAULTS = {
    "allow_headers": ["X-Auth-Token", "X-Openstack-Request-Id", "X-Identity-Status", "X-Roles",
                      "X-Service-Catalog", "X-User-Id", "X-Tenant-Id", "OpenStack-API-Version"],
    "expose_headers": ["X-Auth-Token", "X-Openstack-Request-Id", "X-Subject-Token", "X-Service-Token",
                       "OpenStack-API-Version"],
    "allow_methods": ["GET", "PUT", "POST", "DELETE", "PATCH"],
}


def set_lib_defaults() -> None:
    """Placement's defaults for library options (the ``oslo.config.opts.defaults`` hook)."""
    from oslo_middleware import cors

    cors.set_defaults(**CORS_DEFAULTS)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """Placement's ``placement.conf`` options, for ``oslo-config-generator --namespace placement.conf``."""
    return [
        ("DEFAULT", path_opts),
        ("api", api_opts),
        ("placement", placement_opts),
        ("placement_database", database_opts),
        ("workarounds", workarounds_opts),
    ]


def list_allotment_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """Allotment's own options (``--namespace allotment``)."""
    return [("allotment", allotment_opts), ("placement_database", galera_opts)]


def register_opts(conf: cfg.ConfigOpts, *, cli_logging: bool = False) -> None:
    """Register every option Allotment reads on ``conf`` (before it is parsed);
    ``cli_logging``: oslo.log's options on the command line too."""
    for group, opts in list_opts() + list_allotment_opts():
        conf.register_opts(opts, group=None if group == "DEFAULT" else group)
    # Library-owned groups: registering them here makes values readable
    # before the library itself is loaded, and validation happens at start.
    from oslo_middleware import cors, http_proxy_to_wsgi
    from oslo_middleware.healthcheck import opts as healthcheck_opts
    from oslo_policy import opts as policy_opts

    from allotment import logs

    logs.register_options(conf, cli=cli_logging)
    policy_opts._register(conf)
    set_lib_defaults()
    conf.register_opts(cors.CORS_OPTS, group="cors")
    # GET /healthcheck reads these (allotment/api/health.py).
    conf.register_opts(healthcheck_opts.HEALTHCHECK_OPTS, group="healthcheck")
    conf.register_opts(healthcheck_opts.DISABLE_BY_FILE_OPTS, group="healthcheck")
    # [oslo_middleware] enable_proxy_headers_parsing, as Placement reads it:
    # only then do Forwarded / X-Forwarded-* headers change the request.
    conf.register_opts(http_proxy_to_wsgi.OPTS, group="oslo_middleware")


def _home_dirs() -> list[str]:
    """Where Placement looks for its files and ``placement.conf.d``, in order."""
    home = os.path.expanduser("~")
    return [os.path.join(home, ".placement"), home, DEFAULT_CONFIG_DIR, "/etc"]


def find_config_file() -> str | None:
    """The file upstream would read: $OS_PLACEMENT_CONFIG_DIR's, else the first
    of ~/.placement/, ~/, /etc/placement/, /etc/ that has a placement.conf."""
    directory = os.environ.get("OS_PLACEMENT_CONFIG_DIR", "").strip()
    candidates = []
    if directory:
        candidates.append(os.path.join(directory, DEFAULT_CONFIG_NAME))
    candidates += [os.path.join(place, DEFAULT_CONFIG_NAME) for place in _home_dirs()]
    for path in candidates:
        if os.path.exists(path):
            return path
    return None


def find_config_dirs() -> list[str]:
    """The ``placement.conf.d`` read after the files, found as Placement finds it."""
    for place in _home_dirs():
        path = os.path.join(place, DEFAULT_CONFIG_NAME + ".d")
        if os.path.isdir(path):
            return [path]
    return []


def default_sqlite_url() -> str:
    """Where the embedded default database lives when nothing is configured.

    Its directory is made private (0700) and the file created private
    (0600) before SQLite opens it (SQLite gives its journal and WAL files
    the database file's permissions): the data is the cloud's inventory.
    """
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    directory = os.path.join(base, "allotment")
    path = os.path.join(directory, "placement.sqlite")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(path, 0o600)
    return "sqlite:///" + path


#: Set on a ConfigOpts that runs the embedded default (no file: noauth2 on
#: the loopback address), whose requests must then be addressed to a
#: loopback name (see api/auth.loopback_hosts_only).
EMBEDDED_DEFAULT = "_allotment_embedded_default"


def is_embedded_default(conf: cfg.ConfigOpts) -> bool:
    """Whether ``conf`` is the embedded default, with noauth2 on."""
    return getattr(conf, EMBEDDED_DEFAULT, False) and conf.api.auth_strategy == "noauth2"


def allow_any_host(conf: cfg.ConfigOpts) -> None:
    """Lift the embedded default's loopback-only ``Host`` rule (``allotment
    serve --allow-insecure-noauth`` on a non-loopback address)."""
    setattr(conf, EMBEDDED_DEFAULT, False)


def new(*, cli_logging: bool = False) -> cfg.ConfigOpts:
    """A ConfigOpts with every option registered, not yet parsed (a command
    adds its own command-line options, then calls :func:`parse`)."""
    conf = cfg.ConfigOpts()
    register_opts(conf, cli_logging=cli_logging)
    return conf


def load(config_file: str | list[str] | None = None, *, config_dirs: list[str] | None = None,
         dev_defaults: bool = False, args: list[str] | None = None) -> cfg.ConfigOpts:
    """Build a ConfigOpts from the files named (or found where Placement looks).

    ``config_file``: one path or several, later ones winning; ``config_dirs``:
    directories whose ``*.conf`` files are read after them, in name order
    (default: a ``placement.conf.d`` found as Placement finds it).  Every
    value is validated here, so a bad value fails at start with a message
    that names the option rather than on the first request.
    ``dev_defaults`` applies the embedded defaults (SQLite, noauth2) and is
    used only when no configuration file exists at all.
    """
    files = [config_file] if isinstance(config_file, str) else list(config_file or [])
    for path in files:
        if not os.path.exists(path):
            raise SystemExit(f"configuration file {path} does not exist")
    argv = list(args or [])
    for path in files:
        argv += ["--config-file", path]
    for directory in config_dirs or []:
        argv += ["--config-dir", directory]
    return parse(new(), argv, dev_defaults=dev_defaults)


def parse(conf: cfg.ConfigOpts, argv: list[str], *, dev_defaults: bool = False, prog: str | None = None,
          version: str | None = None, **kwargs) -> cfg.ConfigOpts:
    """Parse ``argv`` (oslo.config's ``--config-file`` / ``--config-dir`` and
    whatever else is registered) as Placement does, then validate.

    Without ``--config-file`` the file is searched for (:func:`find_config_file`);
    without ``--config-dir``, a ``placement.conf.d`` (:func:`find_config_dirs`).
    """
    found = find_config_file()
    conf(argv, project="placement", prog=prog, version=version,
         default_config_files=[found] if found else [], default_config_dirs=find_config_dirs(),
         validate_default_values=True, **kwargs)
    files = list(conf.config_file or []) + list(conf.config_dir and [conf.config_dir] or [])
    if not files and dev_defaults:
        conf.set_override("auth_strategy", "noauth2", group="api")
        conf.set_override("ui", True, group="allotment")
        setattr(conf, EMBEDDED_DEFAULT, True)
    if not conf.placement_database.connection:
        # A configuration file must name its database: falling back to a
        # private SQLite file would let each host of a deployment silently
        # serve its own, empty, data.
        if files or not dev_defaults:
            raise cfg.RequiredOptError("connection", cfg.OptGroup("placement_database"))
        conf.set_override("connection", default_sqlite_url(), group="placement_database")
    validate(conf)
    return conf


def validate(conf: cfg.ConfigOpts) -> None:
    """Read every registered option once so invalid values fail now.

    oslo.config validates lazily; touching each option turns a bad value in
    the file into ``ConfigFileValueError`` naming the group and option.
    """
    groups = ("api", "placement_database", "placement", "oslo_policy", "cors", "allotment", "workarounds",
              "healthcheck", "oslo_middleware")
    checks = [(group_name, opt_name) for group_name in groups for opt_name in conf[group_name]]
    checks += [(None, opt_name) for opt_name in conf if opt_name not in conf._groups]
    for group_name, opt_name in checks:
        try:
            getattr(conf[group_name] if group_name else conf, opt_name)
        except cfg.ConfigFileValueError as error:
            # oslo.config names the option but not its group; say both.
            where = f"[{group_name or 'DEFAULT'}] {opt_name}"
            detail = str(error).rpartition(" is not valid: ")[2] or str(error)
            raise cfg.ConfigFileValueError(f"invalid value for {where}: {detail}") from error
