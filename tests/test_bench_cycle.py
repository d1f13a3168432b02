"""bench/e2e/bench_cycle.py --smoke runs here (tiny shapes, CPU) and writes its CSV + PNG."""

import csv
import sys
from pathlib import Path

from bench_support import smoke_rows

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "e2e" / "bench_cycle.py"


def test_bench_cycle_smoke(tmp_path):
    rows = smoke_rows("e2e/bench_cycle.py", tmp_path, "cycle.csv")
    assert rows and float(rows[0]["cycle_over_step"]) > 0
    assert float(rows[0]["roofline_cycle_over_step"]) > 1.0


def test_rows_of_other_columns_append_under_one_header(tmp_path):
    """Steps append to one CSV (stage 3: one per shape): an error row's fewer columns or a later
    step's new ones must not shift values under the wrong header."""
    sys.path.insert(0, str(SCRIPT.parents[1] / "kernels"))
    from common import append_rows

    path = tmp_path / "rows.csv"
    append_rows(path, [{"a": 1, "b": 2}])
    append_rows(path, [{"a": 3}])
    append_rows(path, [{"a": 4, "c": 5}])
    rows = list(csv.DictReader(path.open()))
    assert [(r["a"], r["b"], r["c"]) for r in rows] == [("1", "2", ""), ("3", "", ""),
                                                         ("4", "", "5")]
