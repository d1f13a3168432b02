"""Training throughput of an EAGLE-3 head on CPU: tokens per second and where the time goes.

    python bench/e2e/bench_train.py --out bench/results/<date>_cpu-2core --batches 3

Every configuration trains the same real batches (ShareGPT train-split conversations rendered
as ``python -m eagle_kernels train`` renders them, ``--batch-tokens`` padded tokens each),
starting from the same head, with the trainer's own step (loss, backward, clipping, AdamW):

* ``recompute-7``: the target's prefill and logits recomputed every step, 7 TTT steps: how the
  bundled head was trained (the baseline);
* ``recompute-4``: 4 TTT steps, the depth a CPU drafts (train.default_ttt_steps): a first epoch;
* ``cached-4`` / ``cached-7``: the target's outputs read from a TargetCache filled beforehand
  (every epoch after the first, or every epoch of a run whose cache was prepared).

Reported per configuration: padded tokens per second (total tokens / total seconds over the
batches), the split between the target's part and the head's, the ratio to the baseline in the
same run, and the compute floor: the step's FLOPs over the GEMM rate measured in the same run
(an in-cache fp32 GEMM). Writes train.json, train.csv and train.png to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import gemm_rate, token_flops  # noqa: E402
from common import append_rows, environment  # noqa: E402

CONFIGS = (("recompute-7", False, 7), ("recompute-4", False, 4), ("cached-4", True, 4),
           ("cached-7", True, 7))
BASELINE = "recompute-7"


def head_step_flops(head, length: int, steps: int, trained_rows: float) -> float:
    """FLOPs per token of ``steps`` TTT steps, forward + backward (3x forward): the midlayer
    and fc on every position, lm_head only on the trained rows, attention over L/2 keys."""
    layer = head.midlayer
    width = head.fc.out_features
    midlayer = sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    attention = 4 * (length / 2) * width
    per_step = 2 * midlayer + attention + 2 * head.lm_head.weight.numel() * trained_rows
    return 3 * (2 * head.fc.weight.numel() + steps * per_step)


def load_batches(tokenizer, count: int, batch_tokens: int, max_length: int):
    from eagle_kernels.train import TrainConfig, batch_plan, build_dataset

    config = TrainConfig(out="", conversations=12 * count, max_length=max_length)
    examples, _ = build_dataset(tokenizer, config, progress=False)
    plan = batch_plan([e[0].numel() for e in examples], batch_tokens, 0, 0)
    full = sorted(plan, key=lambda b: -sum(examples[i][0].numel() for i in b))[:count]
    return examples, full


def run_config(name, cached, steps, target, examples, batches, cache, pad_id):
    """Seconds of the target's part and of the head's part, summed over ``batches``.

    Only APIs that predate this benchmark are used outside the cached branch, so the baseline
    configuration also runs against an older checkout (``PYTHONPATH=OLD --configs recompute-7``).
    """
    from eagle_kernels.ops._validate import no_value_checks
    from eagle_kernels.runtime import training
    from eagle_kernels.runtime.api import DEFAULT_HEAD
    from eagle_kernels.runtime.draft_heads import load_draft_head
    from eagle_kernels.train import collate

    head = load_draft_head(DEFAULT_HEAD, target).float().train()  # a warm start
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-5, betas=(0.9, 0.95))
    target_seconds = head_seconds = 0.0
    tokens = 0
    for batch in batches:
        ids, mask = collate(examples, batch, pad_id, target.device)
        tick = time.perf_counter()
        if cached:
            features, logits, argmax = cache.batch(batch, ids.shape[1])
        else:
            hidden, features = training.target_pass(target, ids, head.feature_layers)
            logits, argmax = training.target_draft_logits(target, hidden,
                                                          training.draft_vocab_ids(head))
        middle = time.perf_counter()
        with no_value_checks():  # as train.batch_loss
            loss = training.eagle3_ttt_loss(head, features.float(), ids, logits,
                                            head.t2d[argmax], mask, steps=steps).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        optimizer.step()
        done = time.perf_counter()
        target_seconds += middle - tick
        head_seconds += done - middle
        tokens += ids.numel()
    trained = sum(int(examples[i][1].sum()) for b in batches for i in b) / tokens
    return {"config": name, "ttt_steps": steps, "cached": cached, "tokens": tokens,
            "target_s": round(target_seconds, 3), "head_s": round(head_seconds, 3),
            "tokens_per_s": round(tokens / (target_seconds + head_seconds), 1),
            "trained_fraction": round(trained, 3)}


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["config"] for r in rows]
    ax.bar(names, [r["tokens_per_s"] for r in rows], color="tab:blue", label="measured")
    ax.scatter(names, [r["floor_tokens_per_s"] for r in rows], color="tab:red", marker="_",
               s=600, label="compute floor")
    ax.set_ylabel("training tokens / s")
    ax.set_title("EAGLE-3 head training throughput (CPU, SmolLM2-135M target)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parse = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parse.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "local"))
    parse.add_argument("--batches", type=int, default=3)
    parse.add_argument("--batch-tokens", type=int, default=4096)
    parse.add_argument("--max-length", type=int, default=512)
    parse.add_argument("--threads", type=int, default=0)
    parse.add_argument("--configs", default=",".join(c[0] for c in CONFIGS))
    parse.add_argument("--label", help="write train-LABEL.* (e.g. a run against an older checkout)")
    args = parse.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from eagle_kernels.runtime import training
    from eagle_kernels.runtime.api import DEFAULT_HEAD, load_target_and_tokenizer
    from eagle_kernels.runtime.draft_heads import load_draft_head

    target, tokenizer, _ = load_target_and_tokenizer(None, torch.float32, "cpu")
    target.requires_grad_(False)
    examples, batches = load_batches(tokenizer, args.batches, args.batch_tokens, args.max_length)
    used = sorted({i for b in batches for i in b})
    head = load_draft_head(DEFAULT_HEAD, target)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    wanted = args.configs.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        cache = None
        if any(c[1] and c[0] in wanted for c in CONFIGS):
            from eagle_kernels.target_cache import TargetCache

            cache = TargetCache(scratch, target, head.feature_layers, ["bench"],
                                training.draft_vocab_ids(head))
            cache.fill(examples, args.batch_tokens, pad_id, progress=False, indices=used)
        for name, cached, steps in CONFIGS:
            if name in wanted:
                rows.append(run_config(name, cached, steps, target, examples, batches, cache,
                                       pad_id))
                print(json.dumps(rows[-1]), flush=True)
    rate = gemm_rate(20)
    length = sum(examples[i][0].numel() for i in used) / len(used)
    baseline = next((r for r in rows if r["config"] == BASELINE), None)
    for row in rows:
        flops = head_step_flops(head, int(length), row["ttt_steps"], row["trained_fraction"])
        if not row["cached"]:
            flops += token_flops(target, int(length / 2))
        row["floor_tokens_per_s"] = round(rate / flops, 1)
        row["x_floor"] = round(row["floor_tokens_per_s"] / row["tokens_per_s"], 2)
        row["x_baseline"] = round(row["tokens_per_s"] / baseline["tokens_per_s"], 2) if baseline else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    summary = {"environment": env, "gemm_gflops": round(rate / 1e9, 1),
               "command": "python bench/e2e/bench_train.py " + " ".join(sys.argv[1:]),
               "rows": rows}
    stem = f"train-{args.label}" if args.label else "train"
    import eagle_kernels
    summary["package"] = str(Path(eagle_kernels.__file__).parent)
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    csv = out / f"{stem}.csv"
    csv.unlink(missing_ok=True)
    append_rows(csv, [{**env, **row} for row in rows])
    plot(rows, out / f"{stem}.png")
    print(f"GEMM rate {rate / 1e9:.1f} GFLOP/s")
    for row in rows:
        print(f"{row['config']:12s} {row['tokens_per_s']:7.1f} tok/s  target {row['target_s']:6.2f} s"
              f"  head {row['head_s']:6.2f} s  x baseline {row['x_baseline']}  floor x {row['x_floor']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
