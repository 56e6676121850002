"""Allotment: a fast, drop-in implementation of the OpenStack Placement API."""

from importlib import metadata as _metadata

try:
    #: The one version source is the package metadata (pyproject.toml's
    #: ``version``), read from the installed distribution.
    __version__ = _metadata.version("allotment")
except _metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
    __version__ = "0+unknown"
