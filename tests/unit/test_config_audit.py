"""The one start-up warning naming options set in placement.conf that have no effect."""

from __future__ import annotations

import logging
import textwrap

import pytest

from allotment import config, config_audit

SQLITE = "sqlite:////tmp/allotment-audit-test.sqlite"


@pytest.fixture(autouse=True)
def no_machine_files(monkeypatch, tmp_path):
    monkeypatch.delenv("OS_PLACEMENT_CONFIG_DIR", raising=False)
    monkeypatch.setattr(config, "DEFAULT_CONFIG_DIR", str(tmp_path / "etc-placement"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def load(tmp_path, body: str, extra: dict[str, str] | None = None):
    path = tmp_path / "placement.conf"
    path.write_text(f"[placement_database]\nconnection = {SQLITE}\n" + textwrap.dedent(body))
    dirs = None
    if extra:
        directory = tmp_path / "conf.d"
        directory.mkdir()
        for name, text in extra.items():
            (directory / name).write_text(textwrap.dedent(text))
        dirs = [str(directory)]
    return config.load(str(path), config_dirs=dirs)


def test_honoured_and_inert_options_are_not_named(tmp_path):
    conf = load(tmp_path, """
        [DEFAULT]
        debug = true
        log_dir = /var/log/placement
        state_path = /var/lib/placement
        [placement_database]
        max_retries = -1
        max_pool_size = 7
        sync_on_startup = true
        [oslo_concurrency]
        lock_path = /var/lib/placement/tmp
        [keystone_authtoken]
        www_authenticate_uri = http://keystone:5000
        memcache_security_strategy = ENCRYPT
        [cors]
        allowed_origin = https://dashboard.example.com
    """)
    assert config_audit.not_honoured(conf) == []


def test_each_option_set_but_not_honoured_is_named_once(tmp_path):
    conf = load(tmp_path, """
        [placement_database]
        slave_connection = sqlite:////tmp/replica.sqlite
        connection_trace = true
        [workarounds]
        optimize_for_wide_provider_trees = true
        [profiler]
        enabled = true
        [placement]
        no_such_option = 1
    """, {"10-more.conf": "[placement_database]\nconnection_trace = false\n[mystery]\nknob = 3\n"})
    named = config_audit.not_honoured(conf)
    assert [entry.split(" (")[0] for entry in named] == [
        "[mystery] knob", "[placement] no_such_option", "[placement_database] connection_trace",
        "[placement_database] slave_connection", "[profiler] enabled",
        "[workarounds] optimize_for_wide_provider_trees"]
    assert "(unknown to Placement and Allotment)" in named[0]
    assert "(reads use the main connection)" in named[3]


def test_deprecated_names_of_registered_options_are_known(tmp_path):
    """oslo.log's old spelling of log_file, ``logfile``, still works: not named."""
    conf = load(tmp_path, "[DEFAULT]\nlogfile = /tmp/allotment-audit.log\n")
    assert conf.log_file == "/tmp/allotment-audit.log"
    assert config_audit.not_honoured(conf) == []


def test_the_warning_is_one_line(tmp_path, caplog):
    conf = load(tmp_path, "[placement_database]\nslave_connection = x\n[profiler]\nenabled = true\n")
    with caplog.at_level(logging.WARNING, logger="allotment.config_audit"):
        config_audit.warn(conf)
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "[placement_database] slave_connection" in message and "[profiler] enabled" in message
    assert "\n" not in message


def test_nothing_to_say_logs_nothing(tmp_path, caplog):
    conf = load(tmp_path, "")
    with caplog.at_level(logging.WARNING, logger="allotment.config_audit"):
        assert config_audit.warn(conf) == []
    assert caplog.records == []
