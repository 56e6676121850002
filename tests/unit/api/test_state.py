"""The process's one owner of state lists every cache it holds."""

import re

from allotment.api import state
from allotment.db.engine import Database
from tests.conftest import make_conf


def test_every_attribute_of_the_owner_is_in_its_listing(tmp_path):
    """A cache added to ProcessState without its key, bound and dropping rule
    in the module's table fails here."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    database = Database(url)
    try:
        owner = state.ProcessState(make_conf(url), database)
        listed = set(re.findall(r"^``(\w+)``", state.__doc__, re.MULTILINE))
        assert set(vars(owner)) == listed
        assert owner.mirror is not None and owner.answers is not None  # SQLite keeps both
        assert owner.providers.forget in database.on_connection_lost
    finally:
        database.dispose()
