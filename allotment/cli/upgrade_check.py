"""``placement-status upgrade check [--json]``: oslo.upgradecheck's report.

The checks Placement runs, under its names and with its outcomes, then
Allotment's own:

* Missing Root Provider IDs: Failure while a provider has no root
  (``placement-manage db online_data_migrations`` fills them in);
* Incomplete Consumers: Warning while allocations name a consumer without
  a record (the same command creates them);
* Policy File JSON to YAML Migration: Failure for a JSON policy file
  (oslo.upgradecheck's own check);
* Allotment Schema: Success with what ``placement-manage db sync`` will
  do next when it has work (a check runs before the upgrade it prepares),
  Failure for an empty database or a schema Allotment does not know.

Exit status as oslo.upgradecheck gives it: 0 all succeeded, 1 a warning,
2 a failure, 255 the checks themselves could not run (the error printed).
Unlike Placement's command, ``--json`` prints JSON, and a database Placement
never set up is a Failure saying so rather than a traceback.
"""

from __future__ import annotations

import sys

from oslo_config import cfg
from oslo_upgradecheck import common_checks, upgradecheck

from allotment.cli import common, version_string
from allotment.cli.manage import as_placement


class Checks(upgradecheck.UpgradeCommands):
    def __init__(self, conf: cfg.ConfigOpts):
        self.conf = conf
        self._db = None

    @property
    def db(self):
        if self._db is None:
            from allotment import service

            self._db = service.database_from_config(self.conf)
        return self._db

    def _count(self, counter) -> int | None:
        """``counter`` on a read connection; None when Placement's tables are not there."""
        from allotment.db import reference_layout

        with self.db.read() as conn:
            if reference_layout.state(conn) in ("empty", "unknown"):
                return None
            return counter(conn)

    def _root_provider_ids(self) -> upgradecheck.Result:
        from allotment.db import reference_layout

        missing = self._count(reference_layout.providers_without_root)
        if missing:
            return upgradecheck.Result(
                upgradecheck.Code.FAILURE,
                f"{missing} resource providers have no root provider id: run "
                "'placement-manage db online_data_migrations'.")
        return upgradecheck.Result(upgradecheck.Code.SUCCESS)

    def _incomplete_consumers(self) -> upgradecheck.Result:
        from allotment.db import online_migrations

        missing = self._count(online_migrations.count_incomplete_consumers)
        if missing:
            return upgradecheck.Result(
                upgradecheck.Code.WARNING,
                f"{missing} consumers with allocations have no consumer record: run "
                "'placement-manage db online_data_migrations'.")
        return upgradecheck.Result(upgradecheck.Code.SUCCESS)

    def _policy_json(self) -> upgradecheck.Result:
        return common_checks.check_policy_json(self, self.conf)

    def _schema(self) -> upgradecheck.Result:
        from allotment.db import migrate, reference_layout

        try:
            ready, message = migrate.status(self.db.engine)
            with self.db.read() as conn:
                found = reference_layout.state(conn)
        except common.schema_errors() as error:
            return upgradecheck.Result(upgradecheck.Code.FAILURE, as_placement(common.one_line(error)))
        if ready:
            return upgradecheck.Result(upgradecheck.Code.SUCCESS)
        code = upgradecheck.Code.FAILURE if found in ("empty", "unknown") else upgradecheck.Code.SUCCESS
        return upgradecheck.Result(code, as_placement(message))

    _upgrade_checks = (
        ("Missing Root Provider IDs", _root_provider_ids),
        ("Incomplete Consumers", _incomplete_consumers),
        ("Policy File JSON to YAML Migration", _policy_json),
        ("Allotment Schema", _schema),
    )


def main(argv: list[str] | None = None) -> int:
    from allotment import config, service

    conf = config.new(cli_logging=True)
    upgradecheck.register_cli_options(conf, Checks(conf))
    try:
        config.parse(conf, sys.argv[1:] if argv is None else argv, prog="placement-status",
                     version=version_string())
    except cfg.Error as error:
        print(f"placement-status: configuration error: {error}", file=sys.stderr)
        return 255
    service.setup_logging(conf, command=True)
    # oslo.upgradecheck reads --json from its module's CONF, which only its
    # own main() sets.
    upgradecheck.CONF = conf
    return upgradecheck.run(conf)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
