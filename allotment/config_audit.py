"""Which ``placement.conf`` options Allotment honours, and the one start-up
warning that names those set in a file but not honoured.

An operator's file keeps working unchanged (oslo.config ignores what it
does not know), so without this an option that changes nothing here would
do so silently.  :data:`NOT_HONOURED` is the whole list: every other
option of Placement's groups and of the libraries' groups Placement reads
(oslo.log's ``[DEFAULT]``, ``[oslo_policy]``, ``[cors]``,
``[keystone_authtoken]``) is honoured.  When a change makes one work, its
row goes.
"""

from __future__ import annotations

import glob
import logging
import os

from oslo_config import cfg

LOG = logging.getLogger(__name__)

#: Set in a file, these are named in the warning, with why.  ``*`` stands
#: for every option of the group.
NOT_HONOURED: dict[tuple[str, str], str] = {
    ("placement_database", "slave_connection"): "reads use the main connection",
    ("placement_database", "connection_trace"): "SQL statements carry no Python stack trace",
    ("workarounds", "optimize_for_wide_provider_trees"): "Allotment's search needs no such switch",
    ("profiler", "*"): "osprofiler tracing is not supported",
}

#: Groups Allotment does not register whose options it honours or, like
#: Placement, has no use for: not named.
QUIET_GROUPS = {
    "keystone_authtoken": "read by keystonemiddleware when [api] auth_strategy = keystone",
    "oslo_concurrency": "Placement takes no external lock either",
}


def files_read(conf: cfg.ConfigOpts) -> list[str]:
    """The configuration files ``conf`` was parsed from, in the order read."""
    found = [path for path in conf.config_file or [] if os.path.exists(path)]
    for directory in conf.config_dir or []:
        found += sorted(glob.glob(os.path.join(directory, "*.conf")))
    return found


def _set_in(path: str) -> dict[str, set[str]]:
    sections: dict = {}
    try:
        cfg.ConfigParser(path, sections).parse()
    except (OSError, cfg.ParseError):
        return {}  # oslo.config itself reports a file it cannot read
    return {group: set(options) for group, options in sections.items()}


def not_honoured(conf: cfg.ConfigOpts) -> list[str]:
    """``[group] option (why)`` for each option set in a file that has no effect here."""
    named: dict[tuple[str, str], str] = {}
    known = _known_names(conf)
    for path in files_read(conf):
        for group, options in _set_in(path).items():
            if group in QUIET_GROUPS:
                continue
            for option in options:
                why = NOT_HONOURED.get((group, option)) or NOT_HONOURED.get((group, "*"))
                if why is None and option not in known.get(group, ()):
                    why = "unknown to Placement and Allotment"
                if why is not None:
                    named[(group, option)] = why
    return [f"[{group}] {option} ({why})" for (group, option), why in sorted(named.items())]


def _known_names(conf: cfg.ConfigOpts) -> dict[str, set[str]]:
    """Every option name registered on ``conf`` by group, deprecated names included."""
    known: dict[str, set[str]] = {}
    tables = [("DEFAULT", conf._opts)]  # oslo.config keeps no public list of Opt objects
    tables += [(name, group._opts) for name, group in conf._groups.items()]
    for group_name, opts in tables:
        for info in opts.values():
            opt = info["opt"]
            known.setdefault(group_name, set()).update((opt.name, opt.dest))
            for old in opt.deprecated_opts:
                known.setdefault(old.group or group_name, set()).add(old.name)
    return known


def warn(conf: cfg.ConfigOpts) -> list[str]:
    """Log the one warning (when there is anything to say); returns what it named."""
    named = not_honoured(conf)
    if named:
        LOG.warning("options set in the configuration that have no effect in Allotment: %s",
                    "; ".join(named))
    return named
