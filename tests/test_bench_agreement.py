"""bench/e2e/bench_agreement.py: teacher-forced n-α of a draft head on given replies."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from eagle_kernels.runtime import training
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head
from runtime_helpers import tiny_target

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_agreement",
                                                  ROOT / "bench/e2e/bench_agreement.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_agreement"] = module
    spec.loader.exec_module(module)
    return module


@torch.no_grad()
def predict_next(head, target, prompt: list[int], reply: list[int]) -> int:
    """The head's step-0 top-1 for the token after ``reply``: position len - 2 (its feature
    and the last token) predicts the token at len."""
    draft_ids = training.draft_vocab_ids(head)
    ids = torch.tensor([prompt + reply])
    hidden, features = training.target_pass(target, ids, head.feature_layers)
    logits, argmax = training.target_draft_logits(target, hidden, draft_ids)
    mask = torch.ones_like(ids, dtype=torch.bool)
    result = training.eagle3_ttt_loss(head, features.float(), ids, logits, head.t2d[argmax],
                                      mask, steps=1, keep_hidden=True)
    return int(draft_ids[head.draft_logits(result.hidden[0][0, ids.shape[1] - 2]).argmax()])


def built_reply(head, target, prompt, first: int, count: int, offset: int) -> list[int]:
    """A reply whose every token after the first is the head's prediction + ``offset`` (mod
    the vocabulary) given the tokens before it: 0 agrees everywhere, 1 nowhere."""
    reply = [first]
    while len(reply) < count:
        reply.append((predict_next(head, target, prompt, reply) + offset) % target.vocab_size)
    return reply


def setup():
    target = tiny_target(seed=5)
    head = new_draft_head(EAGLE3, target, draft_vocab=target.vocab_size, seed=3).float()
    head.t2d[:] = True
    return target, head


def test_alpha_1_is_one_on_replies_the_head_itself_predicts():
    """Every reply token but the first (the prefill's) is the head's step-0 prediction: α_1 must
    be exactly 1 over exactly len(reply) - 1 positions per sequence, with padding between
    sequences of different lengths. An off-by-one in which token a position predicts, or
    counting the first reply token, breaks one of the two."""
    bench = load_bench()
    target, head = setup()
    gen = torch.Generator().manual_seed(0)
    sequences = []
    for prompt_len, reply_len in ((4, 9), (7, 5), (5, 12)):
        prompt = torch.randint(0, target.vocab_size, (prompt_len,), generator=gen).tolist()
        first = int(torch.randint(0, target.vocab_size, (1,), generator=gen))
        sequences.append((prompt, built_reply(head, target, prompt, first, reply_len, 0)))
    other = new_draft_head(EAGLE3, target, draft_vocab=target.vocab_size, seed=4).float()
    other.t2d[:] = True
    # several heads share one target pass per chunk, each counted on its own
    counts, other_counts = bench.count_agreement([head, other], target, sequences, batch=2,
                                                 pad_id=0)
    assert bench.count_agreement([other], target, sequences, batch=2, pad_id=0) == [other_counts]
    assert other_counts["right"][0] < other_counts["tried"][0] == counts["tried"][0]
    assert counts["tried"][0] == sum(len(r) - 1 for _, r in sequences)
    assert counts["right"][0] == counts["tried"][0]
    # later steps are conditional: tried only where every earlier step was right
    assert counts["tried"][1] == sum(len(r) - 2 for _, r in sequences)
    rows = bench.alphas(counts)
    assert rows[0]["alpha"] == 1.0 and rows[0]["stderr"] == 0.0


def test_alpha_1_is_zero_when_no_reply_token_is_the_prediction():
    bench = load_bench()
    target, head = setup()
    prompt = [3, 1, 4, 1]
    wrong = built_reply(head, target, prompt, 5, 8, offset=1)
    [counts] = bench.count_agreement([head], target, [(prompt, wrong)], batch=1, pad_id=0)
    assert counts["tried"][0] == 7 and counts["right"][0] == 0
    assert counts["tried"][1] == 0  # nothing to condition on


def test_report_renders_here_and_in_results_md(tmp_path):
    import json

    bench = load_bench()
    rows = bench.alphas({"tried": [200, 80, 30], "right": [80, 30, 0]})
    assert [r["alpha"] for r in rows] == [0.4, 30 / 80, 0.0]
    assert abs(rows[0]["stderr"] - (0.4 * 0.6 / 200) ** 0.5) < 1e-12
    report = {"environment": {"device": "cpu", "torch": "x", "date": "2026-01-01",
                              "commit": "abc"},
              "command": "python bench/e2e/bench_agreement.py", "max_new_tokens": 8,
              "draft_weights": "exact", "heads": {"bundled": {"humaneval": rows}}}
    assert "| bundled | humaneval | 0.400 ± 0.035 | 0.375 ± 0.054 | 0.000 ± 0.000 | 200 |" \
        in bench.markdown(report)
    run = tmp_path / "2026-01-01_cpu"
    run.mkdir()
    (run / "agreement-x.json").write_text(json.dumps(report))
    results = sys.modules["make_results"]
    text = results.build(tmp_path)
    assert "Teacher-forced acceptance — `2026-01-01_cpu`" in text
    assert "| bundled | humaneval | 0.400 ± 0.035" in text
