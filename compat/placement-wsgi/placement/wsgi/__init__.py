"""See :mod:`placement.wsgi.api`."""
