"""Serve Allotment from an installed venv the way a deployment tool does:
uwsgi with ``etc/uwsgi/placement-api.ini`` or Apache httpd + mod_wsgi with
``etc/apache/placement-api.conf``, each unchanged but for the venv's path,
the port and where logs go.

    python serve.py uwsgi|apache VENV --config-file DIR/placement.conf --port N

As Kolla's bootstrap does, ``placement-manage db sync`` runs first; the
server then runs in the foreground until it is sent SIGTERM.  The
conformance runner starts it through its ``--serve`` template.  Only the
standard library is used: any Python runs it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ETC = Path(__file__).resolve().parents[2] / "etc"
UWSGI_INI = ETC / "uwsgi" / "placement-api.ini"
APACHE_VHOST = ETC / "apache" / "placement-api.conf"
EXAMPLE_VENV = "/opt/allotment/venv"
APACHE = "/usr/sbin/apache2"
APACHE_MODULES = "/usr/lib/apache2/modules"


def uwsgi_ini(port: int) -> str:
    """The example ini, listening on ``port`` (nothing else changed)."""
    text = UWSGI_INI.read_text()
    changed, count = re.subn(r"(?m)^http-socket = .*$", f"http-socket = 127.0.0.1:{port}", text)
    assert count == 1, "the example ini must have one http-socket line"
    return changed


def apache_config(venv: str, port: int, workdir: Path) -> str:
    """A minimal httpd.conf (modules, pid file, user) including the example vhost,
    with the venv's path, the port and the log directory put in."""
    vhost = (APACHE_VHOST.read_text().replace(EXAMPLE_VENV, venv).replace("8778", str(port))
             .replace("/var/log/apache2", str(workdir)))
    (workdir / "placement-api.conf").write_text(vhost)
    return "\n".join([
        f"ServerRoot {workdir}",
        "ServerName 127.0.0.1",
        f"PidFile {workdir}/httpd.pid",
        f"ErrorLog {workdir}/httpd-error.log",
        f"LoadModule mpm_event_module {APACHE_MODULES}/mod_mpm_event.so",
        f"LoadModule authz_core_module {APACHE_MODULES}/mod_authz_core.so",
        f"LoadModule wsgi_module {APACHE_MODULES}/mod_wsgi.so",
        # Apache will not serve as root: its children, and so the WSGI
        # daemon processes, run as nobody.
        "User nobody",
        "Group nogroup",
        f"WSGISocketPrefix {workdir}/wsgi",
        f"Include {workdir}/placement-api.conf",
        "",
    ])


def _open_to_nobody(directory: Path) -> None:
    """The WSGI daemon (nobody) writes the SQLite file, its journal and the log file here."""
    directory.chmod(0o777)
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(0o666)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", choices=["uwsgi", "apache"])
    parser.add_argument("venv")
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    venv = os.path.abspath(args.venv)
    config_dir = Path(args.config_file).resolve().parent
    env = {**os.environ, "OS_PLACEMENT_CONFIG_DIR": str(config_dir), "VIRTUAL_ENV": venv}
    sync = subprocess.run([f"{venv}/bin/placement-manage", "--config-file", args.config_file, "db", "sync"],
                          env=env, stdin=subprocess.DEVNULL)
    if sync.returncode:
        return sync.returncode
    if args.server == "uwsgi":
        ini = config_dir / "placement-api-uwsgi.ini"
        ini.write_text(uwsgi_ini(args.port))
        command = [f"{venv}/bin/uwsgi", "--ini", str(ini)]
    else:
        workdir = config_dir / "apache"
        workdir.mkdir(exist_ok=True)
        conf = workdir / "httpd.conf"
        conf.write_text(apache_config(venv, args.port, workdir))
        _open_to_nobody(config_dir)
        _open_to_nobody(workdir)
        command = [APACHE, "-f", str(conf), "-DFOREGROUND"]
    # Started from the configuration's directory, never from a checkout of
    # Allotment, whose package would be imported instead of the installed one.
    server = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, cwd=config_dir)

    def stop(signum, _frame):
        # uwsgi (die-on-term) and Apache both stop on SIGTERM, finishing what
        # is in flight.  Should the server lead a process group of its own,
        # the whole group (children, WSGI daemons) is told; else the server.
        try:
            os.killpg(server.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            server.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return server.wait()
    finally:
        if server.poll() is None:  # we are being stopped for good: take the server along
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
