"""bench/e2e/bench_cycle.py --smoke runs here (tiny shapes, CPU) and writes its CSV + PNG."""

import csv
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "e2e" / "bench_cycle.py"


def test_bench_cycle_smoke(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "cycle.csv").open()))
    assert rows and float(rows[0]["cycle_over_step"]) > 0
    assert float(rows[0]["roofline_cycle_over_step"]) > 1.0
    assert (tmp_path / "cycle.png").stat().st_size > 0
