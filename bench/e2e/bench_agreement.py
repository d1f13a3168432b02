"""Teacher-forced acceptance of draft heads on the target's own greedy replies: n-α with a
binomial standard error, from one pass per head instead of a generation per tree.

    python bench/e2e/bench_agreement.py --draft eagle_kernels/heads/smollm2-135m-instruct-eagle3 \\
        --draft runs/head-new --sharegpt 100 --humaneval 100 --max-new-tokens 128

The target answers every prompt greedily once (the runtime's autoregressive decoding, batched);
then each head runs the training-time-test forward (``training.eagle3_ttt_loss``, proven equal
to the drafting path by tests/test_training.py) over prompt + reply. At reply position p, step
s predicts the token at p + 2 + s from the tokens the target really produced, which are the
tokens a greedy chain drafts whenever steps 0..s-1 were right. So

* α_1 = P(step 0's top-1 == the target's next token): the depth-1 acceptance of a greedy cycle
  (the CPU's 1/1/2 tree accepts its one draft exactly then);
* α_n = P(step n-1 right | steps 0..n-2 right): the chain's n-α;

over every reply position (not one per cycle, as bench_tau.py counts them: the same quantity
weighted by position instead of by cycle), so a few thousand positions per set give α to
±0.01 where bench_tau's 30 prompts x 48 tokens give ±0.02-0.03. Tokens outside a head's draft
vocabulary count as misses (the runtime cannot draft them). EAGLE-3 heads only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))
sys.path.insert(0, str(ROOT / "bench" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
from bench_tau import prompt_sets  # noqa: E402
from common import environment  # noqa: E402
from make_results import agreement_lines  # noqa: E402

STEPS = 3  # α_1..α_3: the depths CPU trees draft (runtime/tree_budget.py picks 1/1/2 .. 4/3/8)


def greedy_replies(generator, prompts: list[str], max_new: int, batch: int,
                   eos_token_ids=()) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy reply) per prompt (chat template), ``max_new`` tokens
    or up to and with the first of ``eos_token_ids``."""
    from tqdm import tqdm

    sequences = []
    for start in tqdm(range(0, len(prompts), batch), desc="greedy replies", leave=False):
        ids = [generator.encode(p, chat=True) for p in prompts[start:start + batch]]
        out = generator.engine.generate(ids, max_new, speculative=False,
                                        eos_token_ids=eos_token_ids)
        sequences.extend((prompt, reply) for prompt, reply in zip(ids, out.tokens))
    return sequences


@torch.no_grad()
def count_agreement(heads: list, target, sequences, batch: int, pad_id: int) -> list[dict]:
    """Per head, per step: positions tried (steps before all right) and positions right. One
    target pass per chunk serves every head (they read the same target layers)."""
    from eagle_kernels.runtime import training

    layers = {tuple(head.feature_layers) for head in heads}
    if len(layers) != 1:
        raise ValueError(f"--draft: the heads read different target layers {sorted(layers)}")
    counts = [{"tried": [0] * STEPS, "right": [0] * STEPS} for _ in heads]
    for start in range(0, len(sequences), batch):
        chunk = sequences[start:start + batch]
        length = max(len(p) + len(r) for p, r in chunk)
        ids = torch.full((len(chunk), length), pad_id, dtype=torch.int64)
        reply = torch.zeros(len(chunk), length, dtype=torch.bool)
        for b, (prompt, tokens) in enumerate(chunk):
            ids[b, :len(prompt) + len(tokens)] = torch.tensor(prompt + tokens)
            reply[b, len(prompt):len(prompt) + len(tokens)] = True
        hidden, features = training.target_pass(target, ids, heads[0].feature_layers)
        for head, count in zip(heads, counts):
            count_chunk(head, target, hidden, features, ids, reply, count)
    return counts


def count_chunk(head, target, hidden, features, ids, reply, count: dict) -> None:
    """Add one chunk's tried / right positions of one head to ``count``."""
    from eagle_kernels.ops._validate import no_value_checks
    from eagle_kernels.runtime import training

    draft_ids = training.draft_vocab_ids(head)
    logits, argmax = training.target_draft_logits(target, hidden, draft_ids)
    with no_value_checks():
        result = training.eagle3_ttt_loss(head, features.float(), ids, logits, head.t2d[argmax],
                                          reply, steps=STEPS, keep_hidden=True)
    length = ids.shape[1]
    all_right = torch.ones_like(reply)
    for step, out in enumerate(result.hidden):
        predicted = draft_ids[head.draft_logits(out).argmax(-1)]  # [B, L] target ids
        # position p predicts token p + 2 + step from token p + 1: both must be reply tokens
        # (the first reply token is the prefill's, drafted from nothing)
        truth = torch.full_like(ids, -1)
        truth[:, :length - 2 - step] = ids[:, 2 + step:]
        valid = torch.zeros_like(reply)
        valid[:, :length - 2 - step] = reply[:, 1:length - 1 - step] & reply[:, 2 + step:]
        hit = (predicted == truth) & valid
        count["tried"][step] += int((valid & all_right).sum())
        count["right"][step] += int((hit & all_right).sum())
        all_right &= hit


def alphas(counts: dict) -> list[dict]:
    rows = []
    for n, (tried, right) in enumerate(zip(counts["tried"], counts["right"]), start=1):
        alpha = right / tried if tried else float("nan")
        error = math.sqrt(alpha * (1 - alpha) / tried) if tried else float("nan")
        rows.append({"n": n, "alpha": alpha, "stderr": error, "positions": tried})
    return rows


def markdown(report: dict) -> str:
    return "\n".join([f"# Teacher-forced acceptance ({report['environment']['date']})", "",
                      f"command: `{report['command']}`", "",
                      f"{report['max_new_tokens']} greedy reply tokens per prompt; α_n over "
                      "every reply position (± one binomial standard error); draft weights "
                      f"{report['draft_weights']}.", "", *agreement_lines(report)]) + "\n"


def main(argv=None) -> int:
    from eagle_kernels.runtime.api import (DRAFT_WEIGHTS, EagleGenerator, _load_head,
                                           _store_head_weights)

    parse = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parse.add_argument("--draft", action="append", help="head dir (repeat to compare; default: "
                                                         "the bundled head)")
    parse.add_argument("--target", default=None)
    parse.add_argument("--draft-weights", choices=DRAFT_WEIGHTS, default="exact")
    parse.add_argument("--sharegpt", type=int, default=100)
    parse.add_argument("--humaneval", type=int, default=100)
    parse.add_argument("--mtbench", action="append", help="an MT-bench question.jsonl")
    parse.add_argument("--mtbench-count", type=int)
    parse.add_argument("--max-new-tokens", type=int, default=128)
    parse.add_argument("--batch", type=int, default=16)
    parse.add_argument("--label", help="write agreement-LABEL.json / .md")
    parse.add_argument("--out", default=str(ROOT / "bench" / "results" / "local"))
    args = parse.parse_args(argv)
    started = time.perf_counter()
    drafts = args.draft or [None]
    report = {"environment": environment(), "command": "python " + " ".join(sys.argv),
              "max_new_tokens": args.max_new_tokens, "heads": {}}
    # The target loads once; the other heads join it as from_pretrained would load them.
    generator = EagleGenerator.from_pretrained(args.target, drafts[0], tree=None,  # no cycles
                                               draft_weights=args.draft_weights)
    target, heads = generator.engine.target, [generator.engine.head]
    default_target = args.target is None
    with torch.inference_mode(False):
        for draft in drafts[1:]:
            heads.append(_load_head(draft, target, default_target))
            _store_head_weights(heads[-1], args.draft_weights)
    report["draft_weights"] = generator.draft_weights
    # the target's replies do not depend on the head
    replies = {name: greedy_replies(generator, prompts, args.max_new_tokens, args.batch)
               for name, prompts in prompt_sets(args).items()}
    pad = generator.eos_token_ids()[0]
    names = [draft or "bundled" for draft in drafts]
    for name in names:
        report["heads"][name] = {}
    for set_name, sequences in replies.items():
        counts = count_agreement(heads, target, sequences, args.batch, pad)
        for name, count in zip(names, counts):
            report["heads"][name][set_name] = alphas(count)
    report["seconds"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"agreement-{args.label}" if args.label else "agreement"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
