"""bench/kernels/bench_decoder.py --smoke runs here (torch + the Triton interpreter) and writes
its CSV (op, backend, dtype, speedup columns, as bench/verdict.py reads them) and PNG."""

import csv
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "kernels" / "bench_decoder.py"


def test_bench_decoder_smoke(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "bench_decoder.csv").open()))
    assert {(r["op"], r["backend"]) for r in rows} == {
        (op, backend) for op in ("linear", "rms_norm", "apply_rope", "silu_mul")
        for backend in ("torch", "triton")} | {
        ("linear", "triton_m16"), ("linear", "triton_m32"), ("linear_group", "torch"),
        ("linear_group", "triton"), ("linear_group", "triton_per_weight")}
    assert all(float(r["median_us"]) > 0 and r["speedup_vs_torch"] for r in rows)
    assert (tmp_path / "bench_decoder.png").stat().st_size > 0
