"""bench/kernels/bench_kv.py --smoke runs here (torch + the Triton interpreter) and writes its
CSV (op, backend, dtype, speedup columns, as bench/verdict.py reads them) and PNG."""

import csv
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "kernels" / "bench_kv.py"


def test_bench_kv_smoke(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "bench_kv.csv").open()))
    assert {(r["op"], r["backend"]) for r in rows} >= {
        (op, backend) for op in ("compact_kv", "write_kv", "rope_write_kv")
        for backend in ("torch", "triton")} | {("rope_write_kv", "triton_apart")}
    assert all(float(r["median_us"]) > 0 and r["speedup_vs_torch"] for r in rows)
    assert (tmp_path / "bench_kv.png").stat().st_size > 0
