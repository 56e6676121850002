"""``placement-manage`` and ``placement-status``, run as deployment tools run them.

Kolla-Ansible's bootstrap runs ``placement-manage db sync``, its upgrade
``placement-manage db online_data_migrations`` and its prechecks
``placement-status upgrade check``; each is run here as a process of its
own, on a fresh database of the selected backend and on databases the
reference Placement left at each of its five schema revisions (the
take-over test's, ``test_takeover.Templates``).  What each prints and its
exit status are written out below as the reference gives them.

With ``ALLOTMENT_REFERENCE_TESTS=1`` (and the reference's venv), the
opt-in comparison runs the reference's own commands on a copy of the same
database and compares what both print.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from allotment.db import migrate
from tests import reference
from tests.conftest import BACKEND
from tests.functional.test_server import clean_env, fresh_db, write_config  # noqa: F401 (fixture)
from tests.functional.test_takeover import (CONSUMERS_AT, _is_before, needs_reference,  # noqa: F401
                                            templates)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
backend_independent = pytest.mark.skipif(BACKEND != "sqlite", reason="does not depend on the database backend")

TABLE_HEAD = ["+-----------------------------+-------------+-----------+",
              "|          Migration          | Total Found | Completed |",
              "+-----------------------------+-------------+-----------+"]


def command(name: str) -> list[str]:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    module = {"placement-manage": "manage", "placement-status": "upgrade_check"}[name]
    return [sys.executable, "-c", f"import sys; from allotment.cli.{module} import main; sys.exit(main())"]


def run(name: str, config: Path | str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command in a process of its own, as a deployment tool runs it."""
    return subprocess.run(command(name) + ["--config-file", str(config), *args], capture_output=True,
                          text=True, timeout=300, env=env or clean_env(), stdin=subprocess.DEVNULL)


@pytest.fixture
def call(capsys, monkeypatch):
    """The command in this process (the same code, without a second's start-up per run)."""
    from allotment.cli import manage, upgrade_check

    monkeypatch.delenv("OS_PLACEMENT_CONFIG_DIR", raising=False)
    mains = {"placement-manage": manage.main, "placement-status": upgrade_check.main}

    def call_(name: str, config: Path | str, *args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = mains[name](["--config-file", str(config), *args])
        except SystemExit as exit_:
            code = exit_.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess([name, *args], code, out, err)

    return call_


def table(rows: list[tuple[str, int, int]]) -> list[str]:
    """The lines of the table of these rows (columns as wide as their widest cell)."""
    import prettytable

    drawn = prettytable.PrettyTable(["Migration", "Total Found", "Completed"])
    for row in rows:
        drawn.add_row(list(row))
    return str(drawn).splitlines()


def checks(stdout: str) -> list[tuple[str, str]]:
    """(check, result) pairs of oslo.upgradecheck's table."""
    found, name = [], None
    for line in stdout.splitlines():
        text = line.strip("| ").strip()
        if text.startswith("Check: "):
            name = text.removeprefix("Check: ")
        elif text.startswith("Result: ") and name:
            found.append((name, text.removeprefix("Result: ")))
    return found


PLACEMENT_CHECKS = ["Missing Root Provider IDs", "Incomplete Consumers", "Policy File JSON to YAML Migration"]


@pytest.fixture
def config(fresh_db, tmp_path) -> Path:  # noqa: F811 (fixture)
    return write_config(tmp_path / "etc", fresh_db)


# -- a new deployment --------------------------------------------------------

def test_a_new_deployment_as_kolla_bootstraps_it(config):
    """version (None), sync (silent), version, online migrations (nothing), upgrade check (all Success)."""
    version = run("placement-manage", config, "db", "version")
    assert (version.returncode, version.stdout) == (0, "None\n"), version.stderr

    sync = run("placement-manage", config, "db", "sync")
    assert (sync.returncode, sync.stdout) == (0, ""), sync.stderr
    assert "Traceback" not in sync.stderr

    version = run("placement-manage", config, "db", "version")
    assert (version.returncode, version.stdout) == (0, "a082b8bb98d0\n")
    assert migrate.head_revision() in version.stderr

    online = run("placement-manage", config, "db", "online_data_migrations")
    assert online.returncode == 0, online.stderr
    assert online.stdout.splitlines() == ["Running batches of 50 until complete"] + table(
        [("set_root_provider_ids", 0, 0), ("create_incomplete_consumers", 0, 0)])

    status = run("placement-status", config, "upgrade", "check")
    assert status.returncode == 0, status.stdout + status.stderr
    assert checks(status.stdout) == [(name, "Success") for name in PLACEMENT_CHECKS + ["Allotment Schema"]]
    assert status.stdout.splitlines()[1] == "| Upgrade Check Results                     |"


def test_upgrade_check_before_any_sync_fails_and_says_why(config, call):
    status = call("placement-status", config, "upgrade", "check")
    assert status.returncode == 2, status.stdout + status.stderr
    assert checks(status.stdout)[-1] == ("Allotment Schema", "Failure")
    assert "placement-manage db sync" in status.stdout
    assert "Traceback" not in status.stdout + status.stderr


def test_upgrade_check_json(config, call):
    assert call("placement-manage", config, "db", "sync").returncode == 0
    status = call("placement-status", config, "upgrade", "check", "--json")
    assert status.returncode == 0
    report = json.loads(status.stdout)
    assert report["name"] == "Upgrade Check Results"
    assert [(c["check"], c["result"], c["details"]) for c in report["checks"]] == [
        (name, 0, None) for name in PLACEMENT_CHECKS + ["Allotment Schema"]]


@backend_independent
def test_a_json_policy_file_fails_the_check(config, call):
    assert call("placement-manage", config, "db", "sync").returncode == 0
    (config.parent / "policy.json").write_text('{"placement:resource_providers:list": "role:admin"}')
    with config.open("a") as handle:
        handle.write("\n[oslo_policy]\npolicy_file = policy.json\n")
    status = call("placement-status", config, "upgrade", "check")
    assert status.returncode == 2
    assert ("Policy File JSON to YAML Migration", "Failure") in checks(status.stdout)


@backend_independent
@pytest.mark.parametrize("count, code, output", [
    ("0", 127, "Must supply a positive value for max_count\n"),
    ("-3", 127, "Must supply a positive value for max_count\n"),
    ("lots", 127, "Must supply a positive value for max_count\n"),
])
def test_online_migrations_refuse_a_bad_max_count(config, count, code, output, call):
    result = call("placement-manage", config, "db", "online_data_migrations", "--max-count", count)
    assert (result.returncode, result.stdout) == (code, output)


@backend_independent
def test_unknown_subcommand_and_version(capsys):
    from allotment import __version__
    from allotment.cli import manage, upgrade_check

    for main in (manage.main, upgrade_check.main):
        with pytest.raises(SystemExit) as exited:
            main(["--version"])
        assert exited.value.code == 0 and capsys.readouterr().out.strip() == __version__
    with pytest.raises(SystemExit) as exited:
        manage.main(["db", "stamp-me"])
    assert exited.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_config_dir_and_several_files_are_read(fresh_db, tmp_path, call):  # noqa: F811 (fixture)
    """The connection in a --config-dir file, after a --config-file without one."""
    first = tmp_path / "placement.conf"
    first.write_text("[api]\nauth_strategy = noauth2\n")
    extra = tmp_path / "conf.d"
    extra.mkdir()
    (extra / "10-database.conf").write_text(f"[placement_database]\nconnection = {fresh_db}\n")
    sync = call("placement-manage", first, "--config-dir", str(extra), "db", "sync")
    assert sync.returncode == 0, sync.stderr
    version = call("placement-manage", first, "--config-file", str(extra / "10-database.conf"), "db", "version")
    assert version.stdout == "a082b8bb98d0\n", version.stderr


@backend_independent
def test_placement_conf_d_is_found_where_placement_looks(fresh_db, tmp_path, monkeypatch, capsys):  # noqa: F811
    """~/.placement/placement.conf and ~/.placement/placement.conf.d, no option given."""
    from allotment import config
    from allotment.cli import manage

    home = tmp_path / "home"
    (home / ".placement" / "placement.conf.d").mkdir(parents=True)
    (home / ".placement" / "placement.conf").write_text("[api]\nauth_strategy = noauth2\n")
    (home / ".placement" / "placement.conf.d" / "db.conf").write_text(
        f"[placement_database]\nconnection = {fresh_db}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OS_PLACEMENT_CONFIG_DIR", raising=False)
    monkeypatch.setattr(config, "DEFAULT_CONFIG_DIR", str(tmp_path / "no-etc"))
    assert manage.main(["db", "sync"]) == 0
    capsys.readouterr()
    assert manage.main(["db", "version"]) == 0
    assert capsys.readouterr().out == "a082b8bb98d0\n"


# -- databases the reference left at each of its revisions ----------------------

#: What the take-over cloud needs at each revision: (providers without root,
#: consumers without record) before the online migrations.
INCOMPLETE = {revision: (1, 1) if _is_before(revision, CONSUMERS_AT) else (0, 0)
              for revision in reference.REVISIONS}


#: The oldest revision (data to complete first) and the last before 16.0.0
#: (a schema change to make): every branch of the commands; the opt-in
#: comparison below runs all five.
SAMPLED_REVISIONS = [reference.REVISIONS[0], reference.REVISIONS[3]]


@pytest.mark.parametrize("revision", SAMPLED_REVISIONS)
def test_commands_on_placement_revisions(templates, tmp_path, revision, call):  # noqa: F811 (fixture)
    url = templates.copy(revision)
    config = write_config(tmp_path / "etc", url)
    roots, consumers = INCOMPLETE[revision]

    version = call("placement-manage", config, "db", "version")
    assert (version.returncode, version.stdout) == (0, f"{revision}\n"), version.stderr

    status = call("placement-status", config, "upgrade", "check")
    placement_results = checks(status.stdout)[:3]
    assert placement_results == [("Missing Root Provider IDs", "Failure" if roots else "Success"),
                                 ("Incomplete Consumers", "Warning" if consumers else "Success"),
                                 ("Policy File JSON to YAML Migration", "Success")]
    # A schema that db sync will take over is no reason to fail a check made before the upgrade.
    assert status.returncode == (2 if roots else 0), status.stdout + status.stderr

    if roots:
        sync = call("placement-manage", config, "db", "sync")
        assert sync.returncode == 1 and sync.stdout == ""
        assert "placement-manage db online_data_migrations" in sync.stderr
        assert "Traceback" not in sync.stderr
        assert call("placement-manage", config, "db", "version").stdout == f"{revision}\n"

    limited = call("placement-manage", config, "db", "online_data_migrations", "--max-count", "1")
    assert limited.returncode == (1 if roots else 0)
    # One record at most: the pass stops at the first migration that did one.
    expected = table([("set_root_provider_ids", 1, 1)] if roots else
                     [("set_root_provider_ids", 0, 0), ("create_incomplete_consumers", 0, 0)])
    assert limited.stdout.splitlines()[-len(expected):] == expected

    online = call("placement-manage", config, "db", "online_data_migrations")
    assert online.returncode == 0, online.stdout + online.stderr
    lines = online.stdout.splitlines()
    assert lines[0] == "Running batches of 50 until complete"
    if consumers:
        assert lines[1] == "1 rows matched query create_incomplete_consumers, 1 migrated"
    assert lines[-len(TABLE_HEAD) - 3:] == table([("set_root_provider_ids", 0, 0),
                                                  ("create_incomplete_consumers", consumers, consumers)])

    sync = call("placement-manage", config, "db", "sync")
    assert (sync.returncode, sync.stdout) == (0, ""), sync.stderr
    assert call("placement-manage", config, "db", "version").stdout == "a082b8bb98d0\n"
    status = call("placement-status", config, "upgrade", "check")
    assert status.returncode == 0, status.stdout


def test_stamp_a_schema_copied_without_its_revision_then_sync(templates, tmp_path, call):  # noqa: F811
    """Placement's tables copied out of nova_api carry no revision: sync
    refuses them, ``db stamp`` records the revision their layout is at
    (changing nothing else), and the usual steps take them over."""
    revision = reference.REVISIONS[0]
    url = templates.copy(revision)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM alembic_version"))
    config = write_config(tmp_path / "etc", url)
    assert call("placement-manage", config, "db", "version").stdout == "None\n"
    sync = call("placement-manage", config, "db", "sync")
    assert sync.returncode == 1 and "no schema revision" in sync.stderr

    before = rows_of(engine)
    stamp = call("placement-manage", config, "db", "stamp", revision[:4])  # a start of it will do
    assert (stamp.returncode, stamp.stdout, stamp.stderr) == (0, "", "")
    assert call("placement-manage", config, "db", "version").stdout == f"{revision}\n"
    assert rows_of(engine) == before

    assert call("placement-manage", config, "db", "online_data_migrations").returncode == 0
    sync = call("placement-manage", config, "db", "sync")
    assert (sync.returncode, sync.stdout) == (0, ""), sync.stderr
    assert call("placement-manage", config, "db", "version").stdout == "a082b8bb98d0\n"
    engine.dispose()


def rows_of(engine) -> dict[str, list]:
    """Every table's rows, but Placement's revision."""
    meta = sa.MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        return {name: sorted(map(tuple, conn.execute(sa.select(table)).all()), key=repr)
                for name, table in meta.tables.items() if name != "alembic_version"}


def test_stamp_names_head_base_and_refuses_what_it_does_not_know(config, call):
    for name, expected in (("head", "a082b8bb98d0"), ("base", "None"), ("611cd6dffd7b", "611cd6dffd7b"),
                           ("heads", "a082b8bb98d0")):
        stamp = call("placement-manage", config, "db", "stamp", name)
        assert (stamp.returncode, stamp.stdout) == (0, ""), stamp.stderr
        assert call("placement-manage", config, "db", "version").stdout == f"{expected}\n", name
    for name in ("nosuch", "b", "a082b8bb98d0x"):  # "b": two revisions start so
        stamp = call("placement-manage", config, "db", "stamp", name)
        assert (stamp.returncode, stamp.stdout) == (1, "")
        assert stamp.stderr == f"Can't locate revision identified by '{name}'\n"
        assert call("placement-manage", config, "db", "version").stdout == "a082b8bb98d0\n"
    missing = call("placement-manage", config, "db", "stamp")
    assert missing.returncode == 2 and "version" in missing.stderr


def test_stamp_answers_as_the_reference(tmp_path):
    """Exit codes and what the version reads after, ours and the reference's."""
    needs_reference()
    ours_url, theirs_url = (f"sqlite:///{tmp_path / name}.sqlite" for name in ("ours", "theirs"))
    ours = str(write_config(tmp_path / "ours", ours_url))
    theirs = reference.write_conf(str(tmp_path / "theirs"), theirs_url)
    for name in ("b4ed", "b", "nosuch", "611cd6dffd7b", "heads", "base", "head"):
        mine, ref = (run("placement-manage", ours, "db", "stamp", name),
                     _reference_run("placement-manage", theirs, "db", "stamp", name))
        assert (mine.returncode, mine.stdout) == (ref.returncode, ref.stdout), name
        assert mine.stderr.splitlines()[-1:] == [line.split(": ", 1)[-1] for line in ref.stderr.splitlines()[-1:]]
        assert (run("placement-manage", ours, "db", "version").stdout
                == _reference_run("placement-manage", theirs, "db", "version").stdout), name


# -- the reference's commands on the same databases (opt-in) ---------------------

def _reference_run(name: str, config: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(reference.venv(), "bin", name), "--config-file", config, *args],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("revision", reference.REVISIONS)
def test_same_output_as_the_reference(templates, tmp_path, revision):  # noqa: F811 (fixture)
    """Each command, ours and the reference's, on two copies of one database."""
    needs_reference()
    ours = str(write_config(tmp_path / "ours", templates.copy(revision)))
    theirs = reference.write_conf(str(tmp_path / "theirs"), templates.copy(revision))
    steps = [("placement-manage", "db", "version"),
             ("placement-status", "upgrade", "check"),
             ("placement-manage", "db", "online_data_migrations", "--max-count", "1"),
             ("placement-manage", "db", "online_data_migrations"),
             ("placement-status", "upgrade", "check"),
             ("placement-manage", "db", "sync"),
             ("placement-manage", "db", "version"),
             ("placement-manage", "db", "online_data_migrations"),
             ("placement-status", "upgrade", "check")]
    for name, *args in steps:
        mine, ref = run(name, ours, *args), _reference_run(name, theirs, *args)
        where = f"{name} {' '.join(args)} at {revision}"
        assert mine.returncode == ref.returncode, (where, mine.stdout, mine.stderr, ref.stdout, ref.stderr)
        if name == "placement-status":
            assert checks(mine.stdout)[:3] == checks(ref.stdout), where
            assert checks(mine.stdout)[3][0] == "Allotment Schema"
        else:
            assert mine.stdout == ref.stdout, where


def test_reference_takes_back_what_placement_manage_synced(fresh_db, tmp_path):  # noqa: F811 (fixture)
    """The way back: after our sync, the reference's own commands find nothing to do."""
    needs_reference()
    ours = write_config(tmp_path / "ours", fresh_db)
    assert run("placement-manage", ours, "db", "sync").returncode == 0
    theirs = reference.write_conf(str(tmp_path / "theirs"), fresh_db)
    for args in (("db", "version"), ("db", "sync"), ("db", "online_data_migrations")):
        result = _reference_run("placement-manage", theirs, *args)
        assert result.returncode == 0, (args, result.stderr)
    assert _reference_run("placement-manage", theirs, "db", "version").stdout == "a082b8bb98d0\n"
    check = _reference_run("placement-status", theirs, "upgrade", "check")
    assert check.returncode == 0, check.stdout
    engine = sa.create_engine(fresh_db)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == "a082b8bb98d0"
    finally:
        engine.dispose()
