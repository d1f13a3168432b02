"""bench/kernels/bench_decoder.py --smoke runs here (torch + the Triton interpreter) and writes
its CSV (op, backend, dtype, speedup columns, as bench/verdict.py reads them) and PNG."""

from bench_support import smoke_rows


def test_bench_decoder_smoke(tmp_path):
    rows = smoke_rows("kernels/bench_decoder.py", tmp_path, "bench_decoder.csv")
    assert {(r["op"], r["backend"]) for r in rows} == {
        (op, backend) for op in ("linear", "rms_norm", "apply_rope", "silu_mul")
        for backend in ("torch", "triton")} | {
        ("linear", "triton_m16"), ("linear", "triton_m32"), ("linear", "triton_fused_sum"),
        ("linear_group", "torch"),
        ("linear_group", "triton"), ("linear_group", "triton_per_weight")}
    assert all(float(r["median_us"]) > 0 and r["speedup_vs_torch"] for r in rows)
