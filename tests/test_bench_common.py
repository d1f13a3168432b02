"""bench/kernels/common.py's row columns (a floor a row beats is flagged, never silent) and the
floors themselves: common.floor_us's rate, op_bytes.py's byte counts (pure arithmetic)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "kernels"))
import pytest  # noqa: E402
from common import (Bandwidth, Timing, floor_us, memory_bandwidth, plot_bars,  # noqa: E402
                    timing_columns, written_if_interrupted)
from op_bytes import (acceptance_bytes, attention_bytes, build_tree_bytes,  # noqa: E402
                      expand_bytes, kv_copy_bytes, linear_bytes, rejected_chains, rerank_bytes,
                      rms_norm_bytes, rope_bytes, silu_mul_bytes, topk_bytes)


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


# --------------------------------------------------------------------------------------------
# Floors: the bytes an op must move over the fastest bandwidth measured in the run
# --------------------------------------------------------------------------------------------


def test_the_floor_divides_by_the_fastest_rate_measured():
    """Bytes over max(read, write, copy) GB/s, in microseconds: never over the copy rate alone
    when a read stream runs faster (the floor would be lenient by the gap)."""
    rates = Bandwidth(copy_gbps=4000.0, read_gbps=4400.0, write_gbps=4100.0)
    assert rates.floor_gbps == 4400.0
    assert floor_us(4.4e9, rates) == pytest.approx(1e3)  # 4.4 GB at 4400 GB/s: 1 ms
    assert floor_us(1000, rates) == pytest.approx(1000 / 4.4e12 * 1e6)
    assert floor_us(1000, Bandwidth(5000.0, 4400.0, 4100.0)) == pytest.approx(1000 / 5e6)
    columns = rates.columns()
    assert columns == {"floor_gbps": 4400.0, "read_gbps": 4400.0, "write_gbps": 4100.0,
                       "copy_gbps": 4000.0}
    assert "floor bandwidth 4400 GB/s" in str(rates)


def test_memory_bandwidth_measures_three_rates_here():
    rates = memory_bandwidth("cpu", megabytes=4)
    assert all(rate > 0 for rate in rates) and rates.floor_gbps == max(rates)


def test_acceptance_bytes_at_the_flashinfer_point():
    """batch 16, vocab 32000, a chain of 5 draft tokens in bf16: every node's logits, the
    drafted tokens, the outputs; stochastic_accept_chain adds q(x) of every draft token and the
    whole draft row of each sequence that rejects one (a third of the logits' bytes when all
    16 reject: what its floor used to leave out)."""
    batch, nodes, vocab = 16, 6, 32000
    logits = batch * nodes * vocab * 2
    drafted = batch * (nodes - 1)
    written = batch * nodes * 12 + batch * 4
    greedy = acceptance_bytes("greedy_accept_chain", batch, nodes, vocab, 2)
    assert greedy == logits + drafted * 8 + written
    chain = acceptance_bytes("stochastic_accept_chain", batch, nodes, vocab, 2, rejected=16)
    uniforms = drafted * 4 + batch * 4
    assert chain == greedy + uniforms + drafted * 4 + 16 * (vocab - 1) * 4
    assert (chain - greedy) / logits == pytest.approx(1 / 3, rel=0.01)
    none_rejected = acceptance_bytes("stochastic_accept_chain", batch, nodes, vocab, 2)
    assert chain - none_rejected == 16 * (vocab - 1) * 4
    tree = acceptance_bytes("stochastic_accept_tree", batch, nodes, vocab, 2)
    assert tree == greedy + uniforms + drafted * 4  # + parents
    paths = acceptance_bytes("greedy_accept_tree", batch, nodes, vocab, 2, width=4,
                             path_entries=40)
    assert paths == logits + drafted * 8 + 40 * 4 + batch * 4 * 12 + batch * 4
    with pytest.raises(ValueError):
        acceptance_bytes("greedy_accept_tree", batch, nodes, vocab, 2)


def test_rejected_chains_match_the_reference(gen):
    """The sequences whose bonus comes from a residual (a rejected draft token) are those the
    reference accepts fewer than N - 1 tokens in. rejected_chains rounds p and u * q in fp32
    where the reference decides in fp64, so the uniforms are drawn off the reference's
    boundaries (test_acceptance_kernels.uniforms_off_boundaries, NEAR = 1e-5 from every
    decision, redrawn at most REDRAWS times: its false-failure bound); fp32's ~1e-7 relative
    differences then cannot flip a decision."""
    import torch

    from cuda_support import seed_note
    from eagle_kernels.ops import reference
    from test_acceptance_kernels import chain_margin, node_probs, uniforms_off_boundaries

    batch, nodes, vocab = 64, 4, 6
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen)
    draft = torch.softmax(torch.randn(batch, nodes - 1, vocab, generator=gen), -1)
    logits = torch.randn(batch, nodes, vocab, generator=gen)
    for target in (logits, logits.to(torch.bfloat16)):  # bf16: as the benchmark's logits
        probs = node_probs(target, {})
        uniforms, bonus = uniforms_off_boundaries(
            batch, nodes, lambda u, v, b: chain_margin(tokens, draft, probs, u, v, b), gen)
        result = reference.stochastic_accept_chain(tokens, draft, target, uniforms, bonus)
        expected = int((result.num_accepted < nodes - 1).sum())
        # both kinds occur: a sequence keeps its 3 drafts with probability ~0.37 (measured), so
        # all 64 of one kind has probability < 1e-12 (0.63^64)
        assert 0 < expected < batch, seed_note(gen)
        assert rejected_chains(tokens, draft, target, uniforms) == expected, seed_note(gen)


def test_the_other_ops_bytes():
    # Llama-3.1-8B tree attention at 4k: K and V of prefix + tree, q in, out, the packed mask
    assert attention_bytes(1, 60, 4096 + 60, 32, 8, 128, 2, 240) == (
        2 * 4156 * 8 * 128 * 2 + 2 * 60 * 32 * 128 * 2 + 240)
    assert attention_bytes(2, 1, 513, 32, 8, 128, 2) == 2 * 2 * 513 * 1024 * 2 + 2 * 2 * 4096 * 2
    # apply_rope with cos is sin: x in and out, positions, one table row per distinct position
    assert rope_bytes(60 * 4096, 0, 60, 58, 128, 1, 2) == 4 * 60 * 4096 + 60 * 8 + 58 * 256
    # rope_write_kv: q and k rotated, v stored, cos and sin rows
    assert rope_bytes(10, 4, 2, 2, 8, 2, 2) == 2 * 14 * 2 + 16 + 2 * 2 * 8 * 2
    assert linear_bytes(16, 4096, (4096, 1024, 1024), 2) == (
        6144 * 4096 + 16 * 4096 + 16 * 6144) * 2
    assert rms_norm_bytes(1, 4096, 2) == (4 * 4096 + 4096) * 2  # the weight is read too
    assert rms_norm_bytes(3, 8, 2, residual=False) == (2 * 3 * 8 + 8) * 2
    assert silu_mul_bytes(60, 14336, 2) == 3 * 60 * 14336 * 2
    assert kv_copy_bytes(16 * 7, 8 * 128 * 2, 64) == 2 * 16 * 7 * 2048 * 64
    # the drafting ops: top-k over bf16 rows, expand of 10 x 10 candidates, rerank into 60 nodes
    assert topk_bytes(10, 32000, 2, 10) == 10 * 32000 * 2 + 10 * 10 * (4 + 8)
    assert expand_bytes(2, 10, 10) == 2 * 10 * 4 + 2 * 2 * 100 * 4 + 2 * 10 * 12
    assert rerank_bytes(2, 1000, 2 * 59, 5000) == 2 * 8 + 2 * 1000 * 4 + 118 * 12 + 5000 + 118 * 8


def test_build_tree_bytes_are_the_trees_but_its_tokens_and_scores(gen):
    """build_tree reads the parents and writes depth, mask and paths: a DraftTree's tensors
    but the tokens (int64) and scores (fp32) it neither reads nor writes."""
    import torch

    from conftest import random_parents
    from eagle_kernels.ops import reference

    parents = random_parents(2, 12, gen)
    depth, tree_mask, paths = reference.build_tree(parents)
    tree = reference.DraftTree(tokens=torch.zeros(2, 12, dtype=torch.long), parents=parents,
                               depth=depth, scores=torch.zeros(2, 12), tree_mask=tree_mask,
                               paths=paths)
    written = (parents, depth, tree_mask, paths)
    assert build_tree_bytes(tree) == sum(t.numel() * t.element_size() for t in written)


def test_results_tables_name_the_rate_their_floors_used(tmp_path):
    """bench/make_results.py says which bandwidth a kernel CSV's floors divided by; a CSV from
    before the read / write rates (copy only) gets no such line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_results", Path(__file__).resolve().parents[1] / "bench" / "make_results.py")
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    run = tmp_path / "2026-01-04_gpu" / "stage2"
    run.mkdir(parents=True)
    (run / "bench_kv.csv").write_text(
        "op,backend,median_us,x_floor,floor_gbps,read_gbps,write_gbps,copy_gbps,device\n"
        "write_kv,triton,3.1,1.8,4410.5,4410.5,4302.0,4251.9,GPU\n")
    (run / "old.csv").write_text("op,backend,median_us,x_floor,device\nwrite_kv,torch,9,5,GPU\n")
    text = results.build(tmp_path)
    assert ("floors over 4410.5 GB/s, the fastest of read 4410.5, write 4302.0 and copy 4251.9 "
            "GB/s measured in the run") in text
    assert text.count("floors over") == 1


def test_a_csv_of_other_columns_keeps_its_own_first_columns(tmp_path):
    """A CSV sharing one column name with the kernel tables (bench_reply_store's "method") is
    rendered by its own first columns, not by that one name alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_results", Path(__file__).resolve().parents[1] / "bench" / "make_results.py")
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    run = tmp_path / "2026-01-05_cpu"
    run.mkdir()
    (run / "reply_store.csv").write_text("set,method,tokens_per_s,x_ours_ar,device\n"
                                         "sharegpt,ours-eagle,167.9,1.148,CPU\n")
    text = results.build(tmp_path)
    assert "| set | method | tokens_per_s | x_ours_ar | device |" in text
    assert "| sharegpt | ours-eagle | 167.9 | 1.148 | CPU |" in text


def test_grouped_bars_take_the_rows_series_order(tmp_path, monkeypatch):
    """plot_bars (the peers' and the reply store's bar charts): groups sorted, series in the
    rows' order, one bar per (group, series)."""
    import matplotlib.axes

    drawn = []
    real_bar = matplotlib.axes.Axes.bar
    monkeypatch.setattr(matplotlib.axes.Axes, "bar",
                        lambda self, x, h, *a, **k: (drawn.append((k["label"], list(h))),
                                                     real_bar(self, x, h, *a, **k))[1])
    rows = [{"set": "b", "method": "m2", "v": 1}, {"set": "a", "method": "m2", "v": 2},
            {"set": "b", "method": "m1", "v": 3}, {"set": "a", "method": "m1", "v": 4}]
    plot_bars(rows, "set", "method", "v", tmp_path / "x.png", "v", baseline=1.0)
    assert drawn == [("m2", [2.0, 1.0]), ("m1", [4.0, 3.0])]
    assert (tmp_path / "x.png").stat().st_size > 0
