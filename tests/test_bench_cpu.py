"""bench/e2e/bench_cpu.py --smoke runs on the real default model here and writes its files."""

import json
import subprocess
import sys
from pathlib import Path

from package_support import default_model_or_skip

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "e2e" / "bench_cpu.py"


def test_bench_cpu_smoke(tmp_path):
    default_model_or_skip()
    result = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--no-e2e", "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "cpu.json").read_text())
    assert report["floors"]["memory_floor_ms"] > 0 and report["floors"]["gemm_gflop_s"] > 0
    assert {row["what"] for row in report["rows"]} == {"ar_step", "verify", "draft"}
    assert (tmp_path / "cpu.csv").is_file() and (tmp_path / "cpu.png").stat().st_size > 0
