"""bench/kernels/common.py's row columns: a floor a row beats is flagged, never silent."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "kernels"))
import pytest  # noqa: E402
from common import Timing, timing_columns, written_if_interrupted  # noqa: E402


def _timing(us: float) -> Timing:
    return Timing(us, us, us, 5)


def test_a_row_under_its_floor_says_so():
    """bytes / bandwidth is a floor no kernel beats: a row under it (x_floor < 1) means the
    bytes or the rate are wrong, and the row says so (build_tree ran at 0.35 x a "floor" that
    added an unflushed launch)."""
    under = timing_columns(_timing(4.0), _timing(40.0), floor_us=10.0)
    assert under["x_floor"] == 0.4 and under["speedup_vs_torch"] == 10.0
    assert under["floor_note"].startswith("below its floor")
    assert timing_columns(_timing(12.0), None, floor_us=10.0)["floor_note"] == ""


def test_the_launch_has_its_own_column_beside_the_memory_floor():
    row = timing_columns(_timing(6.0), None, floor_us=0.5, launch=2.5)
    assert (row["floor_us"], row["x_floor"], row["launch_us"]) == (0.5, 12.0, 2.5)
    assert row["x_launch_floor"] == 2.0 and row["floor_note"] == ""
    quick = timing_columns(_timing(2.0), None, floor_us=0.5, launch=2.5)
    assert quick["floor_note"].startswith("below launch + floor")
    assert "launch_us" not in timing_columns(_timing(6.0), None, floor_us=0.5)


def test_a_benchmark_cut_short_writes_the_rows_it_timed():
    """A stage step's timeout interrupts its benchmark (SIGINT): the rows timed so far are
    written (there were none: no rows, no speedup, the family's kernels out of auto) and the
    process exits 130."""
    rows, written = [{"op": "a"}], []
    with pytest.raises(SystemExit) as stopped:
        with written_if_interrupted(lambda: written.extend(rows)):
            raise KeyboardInterrupt
    assert stopped.value.code == 130 and written == rows
    with written_if_interrupted(lambda: written.append("again")):
        pass  # finishing normally writes nothing here: the caller writes once
    assert written == rows
