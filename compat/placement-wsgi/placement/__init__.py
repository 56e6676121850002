"""Placement's import path for WSGI servers, serving Allotment.

Installed only by the opt-in ``allotment-placement-wsgi`` distribution, so
that a deployment tool's unchanged ``module = placement.wsgi.api:application``
(uwsgi) or WSGI script serves Allotment.  It holds nothing else of
Placement's: never install it beside the ``openstack-placement`` package.
"""
