"""Allotment's stand-in for the few modules of the ``openstack-placement``
package that nova's functional tests import.

Not Placement: nothing here comes from it.  Nova's tests reach Placement
only through ``placement.tests.functional.fixtures.placement.PlacementFixture``
(which nova's own ``PlacementFixture`` subclasses), and a regression test
or two through ``placement.conf`` and ``placement.tests.fixtures.Database``.
This package offers those names with the same constructor arguments and
hooks, built on Allotment's WSGI application.  ``tests/nova/plugin.py`` puts
it first on ``sys.path`` when nova's tests run against Allotment; the
opt-in reference run leaves it out so that the real package is imported.
"""
