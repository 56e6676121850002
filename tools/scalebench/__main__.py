"""Measure Allotment (and the reference) on a generated cloud of any size.

    tools/scalebench --cloud nested=100000 --db sqlite --scenario first-read --scenario reads
    tools/scalebench --cloud nested=2000 --db postgresql --serve ours --vs reference --scenario stream
    tools/scalebench --cloud flat=500 --scenario statements

See docs/performance.md ("Large clouds") for the scenarios, the output and
the commands behind each published figure; ``--help`` for every option.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
