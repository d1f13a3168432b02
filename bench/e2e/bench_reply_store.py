"""Speculative decoding with and without the reply store (runtime/reply_store.py), beside plain
decoding, on the same held-out prompts in one run.

Three ways to answer each prompt (batch 1, greedy, EOS, ``--max-new-tokens``), each call timed
from token ids to token ids, the order rotating from prompt to prompt and round to round:

* ``ours-ar``        plain decoding;
* ``ours-eagle``     speculative decoding as ``from_pretrained()`` runs it (the tree budget's
                     tree or plain steps with context drafts, and the reply store's drafts where
                     the context has none);
* ``ours-eagle-no-store``  the same without the store.

Per set: tokens/s of each (total tokens over total seconds), the two speculative ones over
ours-ar, tokens per target pass, steps that verified a store draft and the store's tokens
accepted, and whether every output equals ours-ar's (it must). Writes ``reply_store.csv`` / ``.json`` / ``.png`` under ``--out``.

    python bench/e2e/bench_reply_store.py --prompts 24 --rounds 2 --out bench/results/local
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from common import append_rows, environment, plot_bars  # noqa: E402

METHODS = ("ours-ar", "ours-eagle", "ours-eagle-no-store")


def run_call(generator, ids, method: str, max_new: int, eos) -> tuple[list[int], float, object]:
    engine = generator.engine
    store = engine.reply_store
    if method == "ours-eagle-no-store":
        engine.reply_store = None
    try:
        out = engine.generate([ids], max_new, eos_token_ids=eos, speculative=method != "ours-ar")
    finally:
        engine.reply_store = store
    stats = out.stats
    return out.tokens[0], stats.prefill_seconds + stats.decode_seconds, stats


def run_set(generator, prompts: list[str], args) -> dict:
    eos = generator.eos_token_ids()
    totals = {m: {"tokens": 0, "seconds": 0.0, "passes": 0, "store_steps": 0,
                  "store_accepted": 0, "lookup_accepted": 0, "same_as_ar": 0} for m in METHODS}
    turn = 0
    for _ in range(args.rounds):
        for prompt in prompts:
            ids = generator.encode(prompt)
            order = METHODS[turn % 3:] + METHODS[:turn % 3]
            turn += 1
            outputs = {}
            for method in order:
                tokens, seconds, stats = run_call(generator, ids, method, args.max_new_tokens, eos)
                outputs[method] = tokens
                row = totals[method]
                row["tokens"] += len(tokens)
                row["seconds"] += seconds
                row["passes"] += 1 + stats.cycles  # the prefill and every step or cycle
                row["store_steps"] += stats.store_steps
                row["store_accepted"] += stats.store_accepted
                row["lookup_accepted"] += stats.lookup_accepted
            for method in METHODS:
                totals[method]["same_as_ar"] += outputs[method] == outputs["ours-ar"]
    return totals


def table(results: dict, calls: int) -> list[dict]:
    rows = []
    for set_name, totals in results.items():
        ar_rate = totals["ours-ar"]["tokens"] / totals["ours-ar"]["seconds"]
        for method, t in totals.items():
            rate = t["tokens"] / t["seconds"]
            rows.append({"set": set_name, "method": method, "tokens_per_s": round(rate, 2),
                         "x_ours_ar": round(rate / ar_rate, 3),
                         "same_as_ours_ar": f"{t['same_as_ar']}/{calls}",
                         "tokens_per_pass": round(t["tokens"] / t["passes"], 3),
                         "store_steps": t["store_steps"],
                         "store_tokens_accepted": t["store_accepted"],
                         "lookup_tokens_accepted": t["lookup_accepted"]})
    return rows


def main(argv=None) -> int:
    from eagle_kernels.data import humaneval_prompts, sharegpt_prompts
    from eagle_kernels.runtime.api import from_pretrained

    parse = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parse.add_argument("--prompts", type=int, default=24, help="per set")
    parse.add_argument("--rounds", type=int, default=2, help="calls per method and prompt")
    parse.add_argument("--max-new-tokens", type=int, default=128)
    parse.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"
                                            / "local"))
    args = parse.parse_args(argv)
    started = time.perf_counter()
    generator = from_pretrained()
    if generator.engine.reply_store is None:
        raise SystemExit("no reply store loaded (the default target and its head have one)")
    sets = {"sharegpt": sharegpt_prompts(args.prompts, split="heldout"),
            "humaneval": humaneval_prompts(args.prompts)}
    results = {name: run_set(generator, prompts, args) for name, prompts in sets.items()}
    rows = table(results, args.prompts * args.rounds)
    env = environment()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    append_rows(out / "reply_store.csv", rows)
    report = {"environment": env, "command": "python " + " ".join(sys.argv), "rows": rows,
              "store_tokens": len(generator.engine.reply_store),
              "seconds": round(time.perf_counter() - started, 1)}
    (out / "reply_store.json").write_text(json.dumps(report, indent=1))
    plot_bars(rows, "set", "method", "x_ours_ar", out / "reply_store.png",
              "tokens/s over ours-ar", baseline=1.0)
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
