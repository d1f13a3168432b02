"""bench/e2e/bench_reply_store.py: the store is taken out for its no-store calls only (and put
back even when a call fails), and the table's ratios and counts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle_kernels.runtime import Engine
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head
from eagle_kernels.runtime.reply_store import ReplyStore
from runtime_helpers import tiny_target

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    sys.path.insert(0, str(ROOT / "bench" / "kernels"))
    spec = importlib.util.spec_from_file_location("bench_reply_store",
                                                  ROOT / "bench/e2e/bench_reply_store.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_no_store_method_runs_without_the_store():
    bench = load_bench()
    target = tiny_target(seed=1)
    store = ReplyStore([[1, 2, 3]], target.vocab_size)
    engine = Engine(target, new_draft_head(EAGLE3, target), reply_store=store)
    seen = []
    engine.generate = lambda *a, **k: (seen.append((engine.reply_store, k["speculative"])),
                                       SimpleNamespace(tokens=[[1]], stats=SimpleNamespace(
                                           prefill_seconds=0.0, decode_seconds=1.0)))[1]
    generator = SimpleNamespace(engine=engine)
    for method in bench.METHODS:
        bench.run_call(generator, [1, 2], method, 4, [])
    assert seen == [(store, False), (store, True), (None, True)]
    assert engine.reply_store is store

    def fails(*args, **kwargs):
        raise RuntimeError("boom")

    engine.generate = fails
    with pytest.raises(RuntimeError):
        bench.run_call(generator, [1, 2], "ours-eagle-no-store", 4, [])
    assert engine.reply_store is store


def test_the_table_divides_by_ours_ar_of_the_same_set():
    bench = load_bench()
    row = dict(tokens=100, seconds=1.0, passes=100, store_steps=0, store_accepted=0,
               lookup_accepted=0, same_as_ar=4)
    totals = {"ours-ar": row, "ours-eagle": {**row, "seconds": 0.8, "passes": 80,
                                             "store_steps": 7, "store_accepted": 5,
                                             "lookup_accepted": 20},
              "ours-eagle-no-store": {**row, "seconds": 0.9, "passes": 90}}
    rows = {r["method"]: r for r in bench.table({"set": totals}, 4)}
    assert rows["ours-eagle"]["x_ours_ar"] == 1.25 and rows["ours-eagle"]["store_steps"] == 7
    assert rows["ours-eagle"]["tokens_per_pass"] == 1.25
    assert rows["ours-eagle"]["store_tokens_accepted"] == 5
    assert rows["ours-eagle-no-store"]["x_ours_ar"] == pytest.approx(1.111, abs=1e-3)
    assert rows["ours-ar"]["same_as_ours_ar"] == "4/4"
