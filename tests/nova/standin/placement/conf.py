"""``placement.conf.register_opts``: Allotment's options, under Placement's groups and names."""

from allotment.config import register_opts

__all__ = ["register_opts"]
