"""Differential test: the same random request stream to Allotment and to the
reference Placement, answers compared after normalising what Placement
leaves undefined; divergences shrunk to minimal repros.

    tools/difftest --seed 1..5 --requests 2000
    tools/difftest --seed 3 --requests 300 --microversion 1.25-1.39
    tools/difftest --ours-url http://127.0.0.1:8778 --ref-url http://127.0.0.1:8779

See docs/testing.md, "Differential testing".
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
