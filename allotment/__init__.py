"""Allotment: a fast, drop-in implementation of the OpenStack Placement API."""

__version__ = "0.1.0"
