"""Acceptance of a draft head: τ (tokens per cycle) per prompt set and the papers' n-α.

    python bench/e2e/bench_tau.py --draft eagle_kernels/heads/smollm2-135m-instruct-eagle3 \\
        --sharegpt 50 --humaneval 50 --max-new-tokens 64

Greedy decoding with the runtime, per set of prompts (held-out ShareGPT first turns, HumanEval
prompts, any MT-bench question.jsonl):

* τ at the tree under test (default: the runtime's default EAGLE-2 tree, 10 / 6 / 60): tokens
  per cycle (accepted drafts + 1, as ``GenerationStats.tau``), the accepted-length histogram;
* n-α with a chain (top_k 1, depth 6: 7 drafted tokens): α_n = P(draft position n accepted |
  positions 1..n-1 accepted), from the chain's accepted-length histogram
  (``#cycles accepting >= n / #cycles accepting >= n - 1``). Cycles cut short by the token
  budget cannot accept more than the budget left; they are few (one per prompt) and kept;
* with ``--sweep``, τ at 4 / 8 / 16 / 32 / 60 nodes (the tree budget's candidate shapes of
  those sizes), every output again checked against the autoregressive one.

``--label NAME`` writes ``tau-NAME.json`` / ``.md`` instead of ``tau.json`` / ``.md``, so heads
measured on the same prompts sit side by side in one results directory.

Every speculative output is checked against the autoregressive one (greedy: token for token);
a mismatch is an error, not a footnote. Writes JSON + Markdown to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))
sys.path.insert(0, str(ROOT / "bench"))
from common import environment  # noqa: E402
from make_results import sweep_lines  # noqa: E402

from eagle_kernels.runtime.drafting import TreeConfig  # noqa: E402

CHAIN = TreeConfig(top_k=1, depth=6, total_tokens=8)
# --sweep: τ at 4 / 8 / 16 / 32 / 60 nodes, with the tree budget's own shapes of those sizes.
SWEEP_NODES = (4, 8, 16, 32, 60)


def prompt_sets(args) -> dict[str, list[str]]:
    from eagle_kernels.data import humaneval_prompts, mtbench_prompts, sharegpt_prompts

    sets = {}
    if args.sharegpt:
        sets["sharegpt-heldout"] = sharegpt_prompts(args.sharegpt, split="heldout")
    if args.humaneval:
        sets["humaneval"] = humaneval_prompts(args.humaneval)
    for path in args.mtbench or []:
        sets[Path(path).stem] = mtbench_prompts(path, args.mtbench_count)
    return sets


def run_set(generator, prompts, tree, args, baseline=None):
    """Generate every prompt in batches; returns (tokens per prompt, summed stats)."""
    from tqdm import tqdm

    from eagle_kernels.runtime.generation import Engine

    engine = Engine(generator.engine.target, generator.engine.head, tree)
    engine.prompt_lookup = False  # the head's acceptance alone (context drafts replace cycles)
    tokens, histogram, cycles, new = [], {}, 0, 0
    started = time.perf_counter()
    for start in tqdm(range(0, len(prompts), args.batch), desc=f"tree {tree.top_k}/{tree.depth}/"
                      f"{tree.total_tokens}", leave=False):
        batch = [generator.encode(p, chat=True) for p in prompts[start:start + args.batch]]
        out = engine.generate(batch, args.max_new_tokens, speculative=baseline is None)
        tokens.extend(out.tokens)
        cycles += sum(out.stats.accepted_histogram)  # cycles summed over sequences
        new += sum(out.stats.new_tokens)
        for length, count in enumerate(out.stats.accepted_histogram):
            histogram[length] = histogram.get(length, 0) + count
    counts = [histogram.get(i, 0) for i in range(len(histogram))]
    tau = sum((n + 1) * c for n, c in enumerate(counts)) / max(sum(counts), 1)
    return tokens, {"new_tokens": new, "cycles": cycles, "tau": tau, "accepted_histogram": counts,
                    "seconds": time.perf_counter() - started}


def n_alpha(histogram: list[int]) -> list[float | None]:
    """α_n for n = 1..len-1 from an accepted-length histogram (index = accepted drafts)."""
    at_least = [sum(histogram[n:]) for n in range(len(histogram))]
    return [at_least[n] / at_least[n - 1] if at_least[n - 1] else None
            for n in range(1, len(histogram))]


def main(argv=None) -> int:
    from eagle_kernels.runtime.api import DRAFT_WEIGHTS

    parse = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parse.add_argument("--draft", default=None, help="head dir (default: the bundled head)")
    parse.add_argument("--target", default=None)
    parse.add_argument("--draft-weights", choices=DRAFT_WEIGHTS, default="auto",
                       help="the head's weights as from_pretrained keeps them (auto: q8_0 on cpu)")
    parse.add_argument("--sharegpt", type=int, default=50)
    parse.add_argument("--humaneval", type=int, default=50)
    parse.add_argument("--mtbench", action="append", help="an MT-bench question.jsonl")
    parse.add_argument("--mtbench-count", type=int)
    parse.add_argument("--max-new-tokens", type=int, default=64)
    parse.add_argument("--batch", type=int, default=10)
    parse.add_argument("--tree", default="10,6,60", help="TOP_K,DEPTH,TOTAL_TOKENS under test")
    parse.add_argument("--no-chain", action="store_true", help="skip the n-α chain runs")
    parse.add_argument("--sweep", action="store_true", help="also τ at 4/8/16/32/60 nodes")
    parse.add_argument("--label", help="write tau-LABEL.json / .md (several heads, one dir)")
    parse.add_argument("--out", default=str(ROOT / "bench" / "results" / "local"))
    args = parse.parse_args(argv)
    torch.manual_seed(0)

    from eagle_kernels.runtime.api import EagleGenerator

    top_k, depth, total = (int(x) for x in args.tree.split(","))
    tree = TreeConfig(top_k=top_k, depth=depth, total_tokens=total)
    generator = EagleGenerator.from_pretrained(args.target, args.draft, tree=tree,
                                               draft_weights=args.draft_weights)
    report = {"environment": environment(), "command": "python " + " ".join(sys.argv),
              "draft": args.draft or "bundled", "draft_weights": generator.draft_weights,
              "tree": [top_k, depth, total],
              "max_new_tokens": args.max_new_tokens, "sets": {}}
    for name, prompts in prompt_sets(args).items():
        base_tokens, _ = run_set(generator, prompts, tree, args, baseline=True)
        spec_tokens, spec = run_set(generator, prompts, tree, args)
        check_identical(name, tree, base_tokens, spec_tokens)
        entry = {"prompts": len(prompts), "identical_to_autoregressive": True, "tree": spec}
        if args.sweep:
            entry["sweep"] = {}
            for shape in sweep_trees():
                if shape == tree:  # measured above
                    stats = spec
                else:
                    tokens, stats = run_set(generator, prompts, shape, args)
                    check_identical(name, shape, base_tokens, tokens)
                entry["sweep"][str(shape.total_tokens)] = {
                    "tree": [shape.top_k, shape.depth, shape.total_tokens], **stats}
        if not args.no_chain:
            _, chain = run_set(generator, prompts, CHAIN, args)
            entry["chain"] = chain
            entry["n_alpha"] = n_alpha(chain["accepted_histogram"])
        report["sets"][name] = entry
        print(f"{name}: tau {spec['tau']:.2f} (tree {args.tree}), "
              + (f"chain tau {entry['chain']['tau']:.2f}, n-alpha "
                 f"{[round(a, 3) for a in entry['n_alpha'] if a is not None]}"
                 if not args.no_chain else ""), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"tau-{args.label}" if args.label else "tau"
    report["label"] = args.label
    report = merge_previous(out / f"{stem}.json", report)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def sweep_trees() -> list[TreeConfig]:
    from eagle_kernels.runtime.tree_budget import CANDIDATE_TREES

    return [next(t for t in CANDIDATE_TREES if t.total_tokens == n) for n in SWEEP_NODES]


def check_identical(name: str, tree: TreeConfig, base_tokens, spec_tokens) -> None:
    mismatches = [i for i, (a, b) in enumerate(zip(base_tokens, spec_tokens)) if a != b]
    if mismatches:
        raise SystemExit(f"{name}: speculative output (tree {tree.top_k}/{tree.depth}/"
                         f"{tree.total_tokens}) differs from autoregressive for prompts "
                         f"{mismatches}: lossless check failed")


def merge_previous(path: Path, report: dict) -> dict:
    """Keep the other sets of an earlier run into the same directory with the same settings
    (prompt sets can then be measured one call at a time); their commands are kept too."""
    if not path.is_file():
        return report
    previous = json.loads(path.read_text())
    if any(previous.get(key, "exact" if key == "draft_weights" else None) != report[key]
           for key in ("tree", "draft", "draft_weights", "max_new_tokens")):
        return report
    sets = {k: v for k, v in previous["sets"].items() if k not in report["sets"]}
    report["sets"] = {**sets, **report["sets"]}
    if sets and previous["command"] != report["command"]:
        report["command"] = previous["command"] + " ; " + report["command"]
    return report


def markdown(report: dict) -> str:
    env = report["environment"]
    head = f"draft `{report['draft']}`" + (f" ({report['label']})" if report.get("label") else "")
    head += f", weights {report.get('draft_weights', 'exact')}"
    lines = [f"# Draft acceptance ({env['date'][:10]}, {env['device']}, torch {env['torch']})",
             "", f"{head}; command: `{report['command']}`", "",
             f"Greedy, {report['max_new_tokens']} new tokens per prompt; tree "
             f"{'/'.join(map(str, report['tree']))} (top_k / depth / total tokens); outputs "
             "identical to autoregressive decoding on every prompt.", "",
             "| set | prompts | τ (tree) | τ (chain) | " + " | ".join(
                 f"{n}-α" for n in range(1, 8)) + " |",
             "|---|---|---|---|" + "---|" * 7]
    for name, entry in report["sets"].items():
        alphas = entry.get("n_alpha") or []
        cells = [f"{a:.3f}" if a is not None else "–" for a in alphas] + ["–"] * (7 - len(alphas))
        chain = f"{entry['chain']['tau']:.2f}" if "chain" in entry else "–"
        lines.append(f"| {name} | {entry['prompts']} | {entry['tree']['tau']:.2f} | {chain} | "
                     + " | ".join(cells[:7]) + " |")
    return "\n".join(lines + sweep_lines(report)) + "\n"


if __name__ == "__main__":
    sys.exit(main())
