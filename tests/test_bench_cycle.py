"""bench/e2e/bench_cycle.py --smoke runs here (tiny shapes, CPU) and writes its CSV + PNG."""

import csv
import sys
from pathlib import Path

import pytest
import torch

from bench_support import smoke_rows

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "e2e" / "bench_cycle.py"


def test_bench_cycle_smoke(tmp_path):
    rows = smoke_rows("e2e/bench_cycle.py", tmp_path, "cycle.csv")
    assert rows and float(rows[0]["cycle_over_step"]) > 0
    assert float(rows[0]["roofline_cycle_over_step"]) > 1.0
    # where the cycle's time goes: both phases timed (eagerly here: no CUDA)
    assert float(rows[0]["draft_ms"]) > 0 and float(rows[0]["verify_ms"]) > 0
    assert rows[0]["phases_graph"] == "eager (no CUDA)" and not rows[0].get("rest_ms")


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


def test_the_roofline_reads_the_untied_embedding_rows_not_the_table():
    """A decode step reads only its tokens' rows of an untied embedding table (as
    bench_cpu.step_bytes counts it); counting the whole table (1.05 GB of Llama-3.1-8B's
    15 GB) per pass pulled the cycle's roofline ratio down to 1.42 from 1.45."""
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_cycle
    from eagle_kernels.runtime import TreeConfig
    from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head

    target = bench_cycle.random_target("smoke", torch.float32, torch.device("cpu"))
    table = target.model.embed_tokens.weight
    assert table.data_ptr() != target.lm_head.weight.data_ptr()  # untied, as the bench builds
    kv = bench_cycle.kv_bytes(target, 16, 2)
    step = bench_cycle.weight_bytes(target) - table.numel() * table.element_size() + kv
    assert bench_cycle.target_step_bytes(target, 16, 2) == step
    head = new_draft_head(EAGLE3, target)
    tree = TreeConfig(top_k=4, depth=2, total_tokens=10)
    fc = bench_cycle.weight_bytes(head.fc)
    cycle = step + fc + (tree.depth + 2) * (bench_cycle.weight_bytes(head) - fc)
    assert bench_cycle.roofline_ratio(target, head, tree, 16, 2) == pytest.approx(cycle / step)


def test_the_roofline_takes_a_compute_bound_pass_at_its_flops():
    """With rates, a pass's floor is max(bytes / bandwidth, FLOPs / matmul rate): at a large
    enough batch the verify pass is compute-bound and the ratio grows past the bytes-only one
    (the 2026-11-28 H200 batch-8 row gave 1.38 from bytes alone, cycles measured at 5.1 steps);
    at rates that make every pass memory-bound it equals the bytes-only ratio."""
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_cycle
    from eagle_kernels.runtime import TreeConfig
    from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head

    target = bench_cycle.random_target("smoke", torch.float32, torch.device("cpu"))
    head = new_draft_head(EAGLE3, target)
    tree = TreeConfig(top_k=4, depth=2, total_tokens=10)
    bytes_only = bench_cycle.roofline_ratio(target, head, tree, 16, 2)
    assert bench_cycle.roofline_ratio(target, head, tree, 16, 2, 1.0, 1e9) == \
        pytest.approx(bytes_only)  # FLOPs free: memory-bound
    # bandwidth free: every pass compute-bound, the ratio is the FLOPs'
    per_token = 2 * bench_cycle.linear_weights(target)
    fc = head.fc.weight.numel()
    head_flops = 2 * (bench_cycle.linear_weights(head) - fc)
    cycle = 2 * (per_token * 10 + 2 * fc + 2 * head_flops + 2 * 4 * head_flops)
    assert bench_cycle.roofline_ratio(target, head, tree, 16, 2, 1e12, 1.0) == \
        pytest.approx(cycle / (per_token * 2))
    # mixed: rates at which the verify pass is compute-bound and the step memory-bound; each
    # pass takes its own larger term (a sum of both terms, or one term for every pass, gives
    # another number)
    step = bench_cycle.target_step_bytes(target, 16, 2)
    gbps = 1.0
    head_pass = bench_cycle.weight_bytes(head) - bench_cycle.weight_bytes(head.fc)
    verify_s = 3 * step / (gbps * 1e9)  # the FLOPs term: three times the bytes one
    tflops = per_token * 2 * 10 / verify_s / 1e12
    seconds = lambda read, flops: max(read / (gbps * 1e9), flops / (tflops * 1e12))
    assert seconds(step, per_token * 2) == step / (gbps * 1e9)  # the step: memory-bound
    cycle = (verify_s + seconds(bench_cycle.weight_bytes(head.fc), 2 * fc * 2)
             + 2 * seconds(head_pass, head_flops * 2) + 2 * seconds(head_pass, head_flops * 8))
    expected = cycle / seconds(step, per_token * 2)
    assert bench_cycle.roofline_ratio(target, head, tree, 16, 2, gbps, tflops) == \
        pytest.approx(expected)
    assert expected > bytes_only
