"""The checksum's canonical values and the copy's progress display, without a database."""

from __future__ import annotations

import datetime
import io
import struct

from allotment.cli import db_copy as copy_cli
from allotment.db import copy as db_copy


def _as_mysql_float(value: float) -> float:
    """What MariaDB returns for ``value`` stored in a 4-byte FLOAT (6 significant digits)."""
    single = struct.unpack("f", struct.pack("f", value))[0]
    return float(f"{single:.6g}")


def test_floats_compare_as_a_four_byte_float_keeps_them():
    for ratio in (1.0, 1.1, 1.5, 16.0, 0.9999999, 3.3333333333, 1e-05):
        assert db_copy.canonical(ratio) == db_copy.canonical(_as_mysql_float(ratio)), ratio
    assert db_copy.canonical(1.1) != db_copy.canonical(1.2)


def test_datetimes_compare_to_the_second_as_naive_utc():
    plain = datetime.datetime(2024, 5, 6, 7, 8, 9)
    assert db_copy.canonical(plain.replace(microsecond=654321)) == db_copy.canonical(plain)
    aware = datetime.datetime(2024, 5, 6, 9, 8, 9, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    assert db_copy.canonical(aware) == db_copy.canonical(plain) == "2024-05-06 07:08:09"
    assert db_copy.canonical(plain) != db_copy.canonical(plain + datetime.timedelta(seconds=1))


def test_null_is_not_a_string_and_integers_are_plain():
    assert db_copy.canonical(None) != db_copy.canonical("None")
    assert db_copy.canonical(None) != db_copy.canonical("")
    assert [db_copy.canonical(v) for v in (0, 7, True, "VCPU")] == ["0", "7", "1", "VCPU"]


def test_checksum_depends_on_order_and_on_column_boundaries():
    def digest(rows):
        checksum = db_copy.Checksum()
        checksum.add(rows)
        return checksum.hexdigest(), checksum.rows

    assert digest([(1, "a"), (2, "b")]) != digest([(2, "b"), (1, "a")])
    assert digest([(1, "ab", "c")]) != digest([(1, "a", "bc")])
    assert digest([(1, "a")]) == digest([(1, "a")]) and digest([(1, "a")])[1] == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_redrawn_in_place():
    stream = _Terminal()
    bar = copy_cli.progress_for(stream)
    bar.start("allocations", 10)
    bar.advance(5)
    bar.finish()
    shown = stream.getvalue()
    assert shown.endswith("\n") and shown.count("\r") >= 2
    last = shown.rstrip("\n").rsplit("\r", 1)[1]
    assert last.startswith("copy   allocations") and "[" + "#" * copy_cli.BAR_WIDTH + "]" not in last
    assert "5/10" in last and last.endswith("rows/s")


def test_elsewhere_one_line_per_table():
    stream = io.StringIO()
    progress = copy_cli.progress_for(stream)
    for table, total, phase in (("traits", 3, "copy"), ("consumers", 0, "copy"), ("traits", 3, "verify")):
        progress.start(table, total, phase)
        progress.advance(total)
        progress.finish()
    lines = stream.getvalue().splitlines()
    assert [line.split(" rows in ")[0] for line in lines] == [
        "copied traits: 3", "copied consumers: 0", "verified traits: 3"]
    assert "\r" not in stream.getvalue()
