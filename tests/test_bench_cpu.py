"""bench/e2e/bench_cpu.py --smoke runs on the real default model here and writes its files."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from package_support import default_model_or_skip

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "e2e" / "bench_cpu.py"


def test_bench_cpu_smoke(tmp_path):
    default_model_or_skip()
    result = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--no-e2e", "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "cpu.json").read_text())
    floors = report["floors"]
    assert floors["memory_floor_ms"] > 0 and floors["gemm_gflop_s"] > 0
    assert floors["kv_bytes"] > 0 and floors["compute_floor_ms"] > 0
    # the floor reads at the faster of DRAM and a re-read buffer of the step's bytes (a cache
    # may hold those); the fp32 weights (538 MB) at DRAM's
    assert floors["read_bandwidth_gb_s"] == max(floors["dram_bandwidth_gb_s"],
                                                floors["step_sized_bandwidth_gb_s"])
    fp32_bytes = floors["fp32_weight_bytes"] + floors["kv_bytes"]
    fp32_ms = fp32_bytes / floors["dram_bandwidth_gb_s"] / 1e6
    assert abs(floors["fp32_memory_floor_ms"] - fp32_ms) <= 2e-3 * fp32_ms
    ar_row = next(row for row in report["rows"] if row["what"] == "ar_step")
    # the step's floor is physical: max(weights + KV over bandwidth, FLOPs over the GEMM rate)
    bound = max(floors["memory_floor_ms"], floors["compute_floor_ms"])
    assert abs(ar_row["floor_ms"] - bound) <= 1e-3 * bound + 1e-4
    if _cpu_kernels_built():
        assert floors["in_cache_gemv_ms"] > 0
        expected = ar_row["ms"] / floors["in_cache_gemv_ms"]
        assert abs(floors["ar_x_in_cache_gemv"] - expected) < 0.01 * expected
    assert {row["what"] for row in report["rows"]} == {"ar_step", "ar_step_long", "verify",
                                                        "draft"}
    long = next(row for row in report["rows"] if row["what"] == "ar_step_long")
    assert long["context"] == 32 and long["floor_ms"] > report["floors"]["memory_floor_ms"]
    assert (tmp_path / "cpu.csv").is_file() and (tmp_path / "cpu.png").stat().st_size > 0


def _cpu_kernels_built() -> bool:
    from eagle_kernels.ops import available_backends

    return available_backends()["cpu"].available


def test_cache_bytes_counts_what_the_kv_cache_holds_per_token():
    """ar_step_long's floor adds cache_bytes: every layer's K and V rows of `context` tokens,
    as KVCache.allocate lays them out (GQA heads, the model's head_dim, its dtype)."""
    from eagle_kernels.runtime.kv_cache import KVCache

    spec = importlib.util.spec_from_file_location("bench_cpu_module", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    config = SimpleNamespace(num_key_value_heads=3, num_attention_heads=9, hidden_size=576,
                             num_hidden_layers=5, head_dim=32)  # not hidden / heads (64)
    for dtype in (torch.float32, torch.bfloat16):
        cache = KVCache.allocate(5, 1, 40, 3, 32, dtype, "cpu")
        held = sum(t.numel() * t.element_size() for t in cache.all_tensors())
        assert bench.cache_bytes(SimpleNamespace(config=config, dtype=dtype), 40) == held
