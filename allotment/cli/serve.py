"""``allotment serve``: the API under granian, schema brought to head first."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import socket

from allotment.cli import common

LOG = logging.getLogger("allotment")


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except OSError:
            return False


def configure(parser: argparse.ArgumentParser) -> None:
    common.add_config_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8778, help="port to listen on (default 8778)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default: the number of CPUs it may use, at least 2)")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker (default 4)")
    parser.add_argument("--timeout", type=int, default=120,
                        help="seconds before a stuck worker is restarted (default 120)")
    parser.add_argument("--body-timeout", type=float, default=None, metavar="SECONDS",
                        help="seconds a client has to send a request body once its headers have arrived, "
                             "else 408 (default 30); 0: no limit, the request's thread reads the body "
                             "(slightly cheaper; only behind a proxy that buffers request bodies)")
    parser.add_argument("--cpu-affinity", choices=("auto", "off"), default="auto",
                        help="auto (default): bind each worker to a CPU of its own when there are at "
                             "least as many CPUs as workers (less CPU per request); off: let the "
                             "kernel move them")
    parser.add_argument("--allow-insecure-noauth", action="store_true",
                        help="allow [api] auth_strategy = noauth2 on a non-loopback address")


def run(args: argparse.Namespace) -> int:
    from allotment import config, config_audit, server, service

    conf = common.load(args)
    config_audit.warn(conf)
    if conf.api.auth_strategy == "noauth2" and not _is_loopback(args.host):
        if not args.allow_insecure_noauth:
            LOG.error("refusing to serve noauth2 on %s: anyone who can reach it is admin; "
                      "pass --allow-insecure-noauth to do it anyway", args.host)
            return 2
        LOG.warning("serving noauth2 on non-loopback address %s: every caller can claim any identity",
                    args.host)
        config.allow_any_host(conf)
    metrics_dir = server.prepare_metrics(conf)  # before the application is built
    try:
        # allotment serve always brings the schema to head (whatever
        # [placement_database] sync_on_startup says), after waiting for the
        # database as max_retries / retry_interval allow.
        app = service.build_application(conf, prepare=True, wait=True)
    except common.schema_errors() as error:
        LOG.error("not serving: %s", common.one_line(error))
        return 1
    seconds = service.fill_provider_mirror(app)
    if seconds is not None:
        LOG.info("provider mirror read in %.2f s, before the workers start", seconds)
    app.db.dispose()  # never share the migration's connections with forked workers
    workers = args.workers or server.default_workers()
    server.run(app, host=args.host, port=args.port, workers=workers, threads=args.threads,
               timeout=args.timeout, metrics_dir=metrics_dir, pin=args.cpu_affinity == "auto",
               body_timeout=server.BODY_TIMEOUT if args.body_timeout is None else max(args.body_timeout, 0))
    return 0
