"""``placement.wsgi.api:application``: Allotment, built when imported.

As Placement's module does, importing it reads the configuration
(``$OS_PLACEMENT_CONFIG_DIR/placement.conf`` or where Placement looks),
sets up logging, waits for the database as ``[placement_database]
max_retries`` / ``retry_interval`` say and, with ``sync_on_startup``,
migrates.  A database that cannot be served yet gets 503s until it can.
"""

from allotment.wsgi import started_application

application = started_application()
