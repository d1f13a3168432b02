"""What quantized activations (ops.set_cpu_activations) change in the default target's
predictions.

    python bench/e2e/bench_activation_agreement.py --out bench/results/<date>_cpu-2core

For held-out ShareGPT and HumanEval prompts: the fp32 target's greedy reply (ours-AR, fp32
activations, which equals transformers' greedy reply), then the whole sequence scored once with
fp32 activations and once per quantized mode (int16, int8; teacher forcing on the fp32 reply,
one prefill each). Per set and mode, over the reply's positions: how often the two argmaxes
agree, the mean KL(p_fp32 || p_mode), the largest |logit difference|, and where the first
disagreement falls (the position where that mode's greedy decoding would leave the fp32 reply).
Speculative decoding stays lossless in every mode (its output equals that mode's own greedy AR
output, tested); this measures how far a mode's AR output is from the fp32 model's.

Writes ``activation_agreement.csv`` / ``.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_rows, environment  # noqa: E402

from eagle_kernels import ops  # noqa: E402
from eagle_kernels.runtime.drafting import causal_tree_mask  # noqa: E402


def sequence_logits(target, ids: list[int]) -> torch.Tensor:
    """[T, V] fp32 logits of every position of ``ids``, one prefill from an empty cache."""
    count = len(ids)
    cache = target.allocate_cache(1, count)
    tokens = torch.tensor([ids], dtype=torch.int64)
    positions = torch.arange(count, dtype=torch.int64).unsqueeze(0)
    with torch.inference_mode():
        hidden, _ = target(tokens, positions, cache, causal_tree_mask(1, count, target.device))
        return target.logits(hidden)[0].float()


def summary(fp32: list[torch.Tensor], quantized: list[torch.Tensor]) -> dict:
    """Agreement of one mode's reply logits with fp32's, over every prompt's [reply, V] pair."""
    agree, positions, kl, worst, first_diverge, lengths = 0, 0, [], 0.0, [], []
    for a, b in zip(fp32, quantized):
        same = a.argmax(-1) == b.argmax(-1)
        agree += int(same.sum())
        positions += len(same)
        log_p, log_q = a.log_softmax(-1), b.log_softmax(-1)
        kl += (log_p.exp() * (log_p - log_q)).sum(-1).tolist()
        worst = max(worst, float((a - b).abs().max()))
        first_diverge.append(int((~same).nonzero()[0]) if not same.all() else len(same))
        lengths.append(len(same))
    return {"prompts": len(fp32), "positions": positions,
            "top1_agreement": round(agree / positions, 5),
            "mean_kl": round(statistics.mean(kl), 6), "max_kl": round(max(kl), 5),
            "max_abs_logit_diff": round(worst, 4),
            "median_first_disagreement": statistics.median(first_diverge),
            "replies_without_disagreement": sum(f == n for f, n in zip(first_diverge, lengths))}


def compare(generator, prompts: list[str], max_new_tokens: int,
            modes: tuple[str, ...]) -> dict[str, dict]:
    """Per mode, :func:`summary` over ``prompts``: each prompt's fp32 greedy reply and its fp32
    logits computed once, then scored in every mode."""
    target, eos = generator.engine.target, generator.eos_token_ids()
    fp32, quantized = [], {mode: [] for mode in modes}
    for prompt in prompts:
        ids = generator.encode(prompt)
        reply = generator.engine.generate([ids], max_new_tokens, eos_token_ids=eos,
                                          speculative=False).tokens[0]
        full = ids + list(reply)
        span = slice(len(ids) - 1, len(full) - 1)  # logits at t predict token t + 1: the reply
        fp32.append(sequence_logits(target, full)[span])
        for mode in modes:
            ops.set_cpu_activations(mode)
            try:
                quantized[mode].append(sequence_logits(target, full)[span])
            finally:
                ops.set_cpu_activations("fp32")
    return {mode: summary(fp32, logits) for mode, logits in quantized.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/local")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    from bench_e2e import load_prompts
    from eagle_kernels.runtime.api import from_pretrained

    generator = from_pretrained(tree=None)
    rows = []
    for name in ("sharegpt", "humaneval"):
        results = compare(generator, load_prompts(name, args.prompts), args.max_new_tokens,
                          ("int16", "int8"))
        for mode, result in results.items():
            rows.append({"set": name, "activations": mode, **result})
            print(f"{name} {mode}: top-1 agreement {result['top1_agreement']:.4f} over "
                  f"{result['positions']} positions, mean KL {result['mean_kl']:.2e} (max "
                  f"{result['max_kl']:.2e}), max |logit diff| {result['max_abs_logit_diff']}, "
                  f"first disagreement at median position "
                  f"{result['median_first_disagreement']} (none in "
                  f"{result['replies_without_disagreement']}/{result['prompts']} replies)")
    out = Path(args.out)
    append_rows(out / "activation_agreement.csv", rows)
    command = "python bench/e2e/bench_activation_agreement.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    (out / "activation_agreement.json").write_text(json.dumps(
        {"environment": environment(), "rows": rows, "command": command}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
