"""bench/kernels/bench_kv.py --smoke runs here (torch + the Triton interpreter) and writes its
CSV (op, backend, dtype, speedup columns, as bench/verdict.py reads them) and PNG."""

from bench_support import smoke_rows


def test_bench_kv_smoke(tmp_path):
    rows = smoke_rows("kernels/bench_kv.py", tmp_path, "bench_kv.csv")
    assert {(r["op"], r["backend"]) for r in rows} >= {
        (op, backend) for op in ("compact_kv", "write_kv", "rope_write_kv")
        for backend in ("torch", "triton")} | {("rope_write_kv", "triton_apart")}
    assert all(float(r["median_us"]) > 0 and r["speedup_vs_torch"] for r in rows)
