"""Stage 3's summary: cycle / step per shape, backend, batch and context, beside the roofline
ratio.

    python3 bench/stages/cycle_table.py CYCLE_CSV [--write FILE]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

COLUMNS = ("shape", "backend", "batch", "context", "total_tokens", "tree", "cycle_ms",
           "step_ms", "cycle_over_step", "roofline_cycle_over_step", "draft_ms", "verify_ms",
           "rest_ms", "graph_cycle", "ops_off_torch", "error")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    with open(args.csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    lines = ["  ".join(COLUMNS)] + ["  ".join(str(row.get(c, ""))[:60] for c in COLUMNS)
                                    for row in rows]
    text = "cycle time vs autoregressive step\n" + "\n".join(lines)
    print(text)
    if args.write:
        args.write.write_text(text + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
