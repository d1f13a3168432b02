"""Run a benchmark script's ``--smoke`` mode (tiny shapes, CPU: torch and the Triton
interpreter) and read back what it wrote: one helper for the benchmarks' smoke tests."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def smoke_rows(script: str, tmp_path: Path, table: str) -> list[dict]:
    """Run ``bench/<script> --smoke --out tmp_path``; the rows of its CSV ``table`` (whose PNG,
    same name, must be there and not empty)."""
    result = subprocess.run([sys.executable, str(BENCH / script), "--smoke", "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / table).with_suffix(".png").stat().st_size > 0
    with (tmp_path / table).open() as file:
        return list(csv.DictReader(file))
