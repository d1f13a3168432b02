"""End-to-end generation speed, side by side, on the same prompts in one run.

Four ways to answer each prompt with the same target (batch 1, greedy, same EOS rule):

* ``ours-ar``      plain autoregressive decoding of this runtime (the like-for-like baseline),
* ``ours-eagle``   speculative decoding of this runtime: the EAGLE head's dynamic tree where
                   the tree budget expects it to beat plain steps, else plain steps that verify
                   context (prompt-lookup) drafts where the context has some (the columns say
                   which ran: tree cycles and their tokens, context-draft steps and theirs),
* ``hf-greedy``    transformers ``generate`` (greedy),
* ``hf-lookup``    transformers prompt-lookup decoding (a speculative peer that needs no draft).

Per prompt set it prints tokens/s of each, EAGLE's speedup over each baseline, τ (tokens per
cycle of the head's tree), tokens per target pass (every pass: prefill, tree cycles, plain
steps with or without context drafts), the accepted-length histogram, efficiency (speedup over
ours-ar divided by tokens per target pass: the share of the ideal speedup the overhead
leaves), and whether EAGLE's greedy output equals
ours-ar's token for token (it must) and hf-greedy's (numerics differ slightly). Rows go to
``e2e.csv`` (with device, versions, date, commit), the table to ``e2e.json``, a bar chart to
``e2e.png``.

    python bench/e2e/bench_e2e.py --sets humaneval sharegpt --prompts 10 --max-new-tokens 128
    python bench/e2e/bench_e2e.py --sets path/to/question.jsonl        # MT-bench format
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from common import append_rows, environment  # noqa: E402

from eagle_kernels.cli import DTYPES, _tree  # noqa: E402
from eagle_kernels.data import humaneval_prompts, mtbench_prompts, sharegpt_prompts  # noqa: E402
from eagle_kernels.runtime.api import from_pretrained  # noqa: E402

METHODS = ("ours-ar", "ours-eagle", "hf-greedy", "hf-lookup")


def load_prompts(name: str, count: int) -> list[str]:
    if name == "humaneval":
        return humaneval_prompts(count)
    if name == "sharegpt":
        return sharegpt_prompts(count, split="heldout")
    return mtbench_prompts(name, count)


def hf_model(target, dtype, device):
    from transformers import AutoModelForCausalLM

    if target is None:
        from eagle_kernels.runtime.default_model import default_model_dir

        target = default_model_dir()
    return AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype,
                                                local_files_only=True).to(device).eval()


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_hf(model, ids: list[int], max_new_tokens: int, eos: list[int], lookup: bool,
           device: str) -> tuple[list[int], float]:
    from transformers import GenerationConfig

    options = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                   pad_token_id=eos[0])
    if lookup:
        options["prompt_lookup_num_tokens"] = 10
    tokens = torch.tensor([ids], device=device)
    _sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(tokens, attention_mask=torch.ones_like(tokens),
                             generation_config=GenerationConfig(**options))
    _sync(device)
    return out[0, len(ids):].tolist(), time.perf_counter() - start


def run_set(generator, hf, prompts: list[str], args) -> dict:
    """Time every method on every prompt; return totals per method and EAGLE's statistics."""
    eos = generator.eos_token_ids()
    totals = {m: {"tokens": 0, "seconds": 0.0} for m in METHODS}
    histogram, cycles, same_as_ar, same_as_hf, fallbacks = None, 0, 0, 0, 0
    plain = {"plain_steps": 0, "lookup_steps": 0, "lookup_accepted": 0}  # ours-eagle's
    passes = 0  # ours-eagle's target passes: a prefill and every step or cycle after it
    trees: dict[str, int] = {}  # tree shape -> cycles (the adaptive tree changes between cycles)
    cycle_over_step = []  # per prompt that speculated throughout: its cycle / ours-ar's step
    for prompt in prompts:
        ids = generator.encode(prompt)
        outputs, per_cycle = {}, {}
        for method in METHODS:
            if method.startswith("hf") and hf is None:
                continue
            if method.startswith("ours"):
                result = generator.engine.generate([ids], args.max_new_tokens,
                                                   eos_token_ids=eos,
                                                   speculative=method == "ours-eagle")
                stats = result.stats
                tokens, seconds = result.tokens[0], stats.prefill_seconds + stats.decode_seconds
                if method == "ours-eagle" and stats.fallback:
                    fallbacks += 1  # decoded plainly (part or all): the tree budget's call
                if method == "ours-eagle":
                    for name in plain:  # plain steps and those that verified context drafts
                        plain[name] += getattr(stats, name)
                    passes += 1 + stats.cycles
                # a cycle's cost: calls whose every cycle was the head's tree (no plain steps,
                # no context drafts in place of the tree)
                if stats.cycles and not stats.plain_steps and not stats.context_cycles and (
                        stats.mode == "speculative") == (method == "ours-eagle"):
                    per_cycle[method] = stats.decode_seconds / stats.cycles
                if method == "ours-eagle" and stats.mode == "speculative":
                    hist = stats.accepted_histogram  # speculative cycles only
                    histogram = hist if histogram is None else [
                        a + b for a, b in itertools.zip_longest(histogram, hist, fillvalue=0)]
                    cycles += stats.cycles - stats.plain_steps
                    for name, count in stats.tree_cycles.items():
                        trees[name] = trees.get(name, 0) + count
            else:
                tokens, seconds = run_hf(hf, ids, args.max_new_tokens, eos,
                                         method == "hf-lookup", args.device)
            outputs[method] = tokens
            totals[method]["tokens"] += len(tokens)
            totals[method]["seconds"] += seconds
        if len(per_cycle) == 2:  # timed a minute apart at most: the same machine state
            cycle_over_step.append(per_cycle["ours-eagle"] / per_cycle["ours-ar"])
        same_as_ar += outputs["ours-eagle"] == outputs["ours-ar"]
        same_as_hf += outputs["ours-eagle"] == outputs.get("hf-greedy")
    return {"totals": totals, "histogram": histogram or [0], "cycles": cycles, "trees": trees,
            "fallbacks": fallbacks, "cycle_over_step": cycle_over_step, **plain,
            "target_passes": passes,
            "identical_to_ours_ar": same_as_ar, "identical_to_hf_greedy": same_as_hf,
            "prompts": len(prompts)}


def rows_of(set_name: str, result: dict, generator, args) -> list[dict]:
    totals = result["totals"]
    rate = {m: t["tokens"] / t["seconds"] for m, t in totals.items() if t["seconds"] > 0}
    histogram = result["histogram"]
    # 1.0 when no cycle of a tree ran (as GenerationStats.tau): the call decoded plainly
    tau = (sum((n + 1) * c for n, c in enumerate(histogram)) / sum(histogram)
           if sum(histogram) else 1.0)
    trees = sorted(result["trees"].items(), key=lambda item: -item[1])
    tree_column = " ".join(f"{name}x{count}" for name, count in trees)
    eagle = totals["ours-eagle"]["tokens"]
    per_pass = eagle / result["target_passes"] if result["target_passes"] else 1.0
    eagle_only = {  # what produced ours-eagle's tokens: the head's tree or context drafts
        "tree_cycles": sum(histogram), "tree_tokens": sum((n + 1) * c
                                                          for n, c in enumerate(histogram)),
        "target_passes": result["target_passes"], "tokens_per_pass": round(per_pass, 3)}
    rows = []
    for method, tokens_per_second in rate.items():
        row = {"set": set_name, "method": method, "prompts": result["prompts"],
               "max_new_tokens": args.max_new_tokens, "tokens": totals[method]["tokens"],
               "seconds": round(totals[method]["seconds"], 3),
               "tokens_per_second": round(tokens_per_second, 2),
               "eagle_speedup_over_this": round(rate["ours-eagle"] / tokens_per_second, 3),
               "tau": round(tau, 3) if method == "ours-eagle" else "",
               # the speedup over ours-ar as a share of tokens per target pass (<= 1)
               "efficiency": round(rate["ours-eagle"] / rate["ours-ar"] / per_pass, 3)
               if method == "ours-eagle" else "",
               **{key: value if method == "ours-eagle" else ""
                  for key, value in eagle_only.items()},
               "accepted_histogram": " ".join(map(str, histogram))
               if method == "ours-eagle" else "",
               "tree": tree_column,  # top_k/depth/nodes x cycles, most used first
               "plain_fallback_prompts": f"{result['fallbacks']}/{result['prompts']}"
               if method == "ours-eagle" else "",
               # a whole cycle (draft, verify, accept, compact, commit, loop) in plain steps:
               # median over the prompts that speculated throughout, each against the ours-ar
               # call on the same prompt just before it
               "cycle_x_ar_step": round(statistics.median(result["cycle_over_step"]), 3)
               if method == "ours-eagle" and result["cycle_over_step"] else "",
               "speculated_prompts": len(result["cycle_over_step"])
               if method == "ours-eagle" else "",
               # steps (plain or in place of a cycle) that verified a draft from the context
               # (runtime/lookup.py) and the drafted tokens they accepted
               "plain_steps": result["plain_steps"] if method == "ours-eagle" else "",
               "context_draft_steps": result["lookup_steps"] if method == "ours-eagle" else "",
               "context_tokens_accepted": result["lookup_accepted"]
               if method == "ours-eagle" else "",
               "draft": args.draft or "default",
               "identical_to_ours_ar": f"{result['identical_to_ours_ar']}/{result['prompts']}",
               "identical_to_hf_greedy": f"{result['identical_to_hf_greedy']}/{result['prompts']}"}
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    header = f"{'set':<14}{'method':<12}{'tok/s':>9}{'EAGLE x':>9}{'tau':>7}{'eff':>7}"
    print(header)
    for row in rows:
        print(f"{Path(str(row['set'])).name[:13]:<14}{row['method']:<12}"
              f"{row['tokens_per_second']:>9}{row['eagle_speedup_over_this']:>9}"
              f"{row['tau']!s:>7}{row['efficiency']!s:>7}")
    for row in rows:
        if row["method"] == "ours-eagle":
            print(f"{row['set']}: {row['tree_cycles']} cycles of the head's tree gave "
                  f"{row['tree_tokens']} of {row['tokens']} tokens; {row['tokens_per_pass']} "
                  f"tokens per target pass; "
                  f"histogram {row['accepted_histogram']} (speculative cycles); "
                  f"trees {row['tree'] or '-'}; plain decoding chosen on "
                  f"{row['plain_fallback_prompts']} prompts ({row['plain_steps']} plain steps); "
                  f"{row['context_draft_steps']} steps verified context drafts, "
                  f"{row['context_tokens_accepted']} drafted tokens accepted; a cycle = "
                  f"{row['cycle_x_ar_step'] or '-'} x an AR step (median over the "
                  f"{row['speculated_prompts']} prompts that speculated throughout); "
                  f"EAGLE == ours-ar on "
                  f"{row['identical_to_ours_ar']} prompts, == hf-greedy on "
                  f"{row['identical_to_hf_greedy']}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = sorted({str(r["set"]) for r in rows})
    figure, axes = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(METHODS)
    for i, method in enumerate(METHODS):
        values = [next((r["tokens_per_second"] for r in rows
                        if r["set"] == s and r["method"] == method), 0) for s in sets]
        axes.bar([j + i * width for j in range(len(sets))], values, width, label=method)
    axes.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))],
                    [Path(s).name for s in sets])
    axes.set_ylabel("tokens / s (batch 1, greedy)")
    axes.set_title(f"end to end on {environment()['device']}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None, generator=None) -> int:
    """``generator``: an already loaded EagleGenerator (bench_cpu.py passes its own)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["humaneval", "sharegpt"],
                        help="humaneval, sharegpt (held-out split) or a question.jsonl path")
    parser.add_argument("--prompts", type=int, default=10, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--target", help="HF checkpoint dir (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", help="EAGLE head dir or random-eagle3 (default: bundled)")
    parser.add_argument("--tree", type=_tree, default="auto")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baselines")
    parser.add_argument("--out", default="bench/results/local")
    parser.add_argument("--smoke", action="store_true", help="1 prompt per set, 8 tokens")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompts, args.max_new_tokens = 1, 8
    dtype = DTYPES[args.dtype]
    if generator is None:
        generator = from_pretrained(args.target, args.draft, dtype, args.device, args.tree)
    if getattr(generator, "budget", None) is not None:
        print(generator.budget.report())
    hf = None if args.no_hf else hf_model(args.target, dtype, args.device)
    rows = []
    warm = argparse.Namespace(**{**vars(args), "max_new_tokens": 4})
    run_set(generator, hf, load_prompts(args.sets[0], 1), warm)  # untimed: first-call costs
    for name in args.sets:
        result = run_set(generator, hf, load_prompts(name, args.prompts), args)
        rows += rows_of(name, result, generator, args)
    print_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    append_rows(out / "e2e.csv", rows)
    result = {"environment": environment(), "rows": rows}
    if getattr(generator, "budget", None) is not None:  # what it timed while generating
        result["tree_budget"] = generator.budget.report()
        print(result["tree_budget"])
    (out / "e2e.json").write_text(json.dumps(result, indent=2))
    plot(rows, out / "e2e.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
