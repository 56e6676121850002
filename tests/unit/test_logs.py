"""The request line's formatter writes exactly what oslo.log's ContextFormatter writes."""

from __future__ import annotations

import logging
import sys

import pytest
from oslo_log import formatters

from allotment import config, logs

ENVIRON = {"HTTP_X_USER_ID": "u-1", "HTTP_X_TENANT_ID": "p-1", "HTTP_X_USER_DOMAIN_ID": "default",
           "openstack.request_id": "req-0096dbb5-941e-43b0-a257-2ae7cd573a58",
           "openstack.global_request_id": "req-11111111-2222-3333-4444-555555555555"}


@pytest.fixture
def conf(tmp_path, monkeypatch):
    monkeypatch.delenv("OS_PLACEMENT_CONFIG_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(config, "DEFAULT_CONFIG_DIR", str(tmp_path / "etc"))
    path = tmp_path / "placement.conf"
    path.write_text(f"[placement_database]\nconnection = sqlite:///{tmp_path}/p.sqlite\n")
    return config.load(str(path))


def record(level=logging.INFO, environ=ENVIRON, exc_info=None, **extra) -> logging.LogRecord:
    made = logging.getLogger("placement.requestlog").makeRecord(
        "placement.requestlog", level, __file__, 1, '%s "%s %s" status: %s', ("10.0.0.5", "GET", "/", 200),
        exc_info, "f")
    if environ is not None:
        made.context = logs.request_context(environ)
    made.__dict__.update(extra)
    return made


def both(conf, made) -> tuple[str, str]:
    kwargs = {"project": "placement", "version": "0.2.0", "datefmt": conf.log_date_format, "config": conf}
    fast = logs.fast_context_formatter(formatters.ContextFormatter)(**kwargs)
    oslo = formatters.ContextFormatter(**kwargs)
    copy = logging.makeLogRecord(dict(made.__dict__))
    return fast.format(made), oslo.format(copy)


@pytest.mark.parametrize("overrides", [
    {},
    {"logging_context_format_string": "%(isotime)s %(project)s %(version)s %(global_request_id)s "
                                      "%(request_id)s [%(user_identity)s] %(user_name)s %(tenant)s %(message)s "
                                      "%(error_summary)s"},
    {"logging_user_identity_format": "%(user)s/%(project)s/%(user_domain)s/%(system_scope)s"},
    {"log_date_format": "%H:%M:%S"},
])
@pytest.mark.parametrize("made", [
    lambda: record(),
    lambda: record(environ={"openstack.request_id": "req-0096dbb5-941e-43b0-a257-2ae7cd573a58"}),
    lambda: record(level=logging.WARNING),
    lambda: record(level=logging.DEBUG),
    lambda: record(environ=None),
    lambda: record(instance={"uuid": "i-1"}),
    lambda: record(exc_info=(ValueError, ValueError("boom"), None)),
])
def test_same_text_as_oslo_log(conf, overrides, made):
    for name, value in overrides.items():
        conf.set_override(name, value)
    fast, oslo = both(conf, made())
    assert fast == oslo


def test_the_default_request_line(conf):
    fast, _ = both(conf, record())
    assert fast.endswith(" INFO placement.requestlog [req-11111111-2222-3333-4444-555555555555 "
                         "req-0096dbb5-941e-43b0-a257-2ae7cd573a58 u-1 p-1 - - default -] "
                         '10.0.0.5 "GET /" status: 200')


def test_setup_installs_it_on_oslo_handlers(conf, tmp_path):
    conf.set_override("log_file", str(tmp_path / "p.log"))
    root = logging.getLogger()
    root.__dict__.pop("_allotment_configured", None)
    logs.setup(conf)
    assert [type(handler.formatter).__name__ for handler in root.handlers] == ["FastContextFormatter"]
    assert sys.modules["oslo_log.formatters"] is formatters
