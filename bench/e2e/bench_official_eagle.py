"""Ours against the official EAGLE code (SafeAILab/EAGLE), side by side on the same prompts.

One process, one target (SmolLM2-135M-Instruct, fp32 activations), one EAGLE-3 head (the bundled
one, or ``--draft``), batch 1, greedy. Per prompt each method answers once, in an order that
rotates from prompt to prompt (this VM's speed drifts over minutes; every method sees every
position as often), after an untimed warm-up call each:

* ``ours-ar``              this runtime's plain decoding,
* ``ours-eagle``           this runtime's speculative decoding as ``from_pretrained()`` runs it
                           (the tree budget's tree, context drafts, plain steps where no tree pays),
* ``ours-eagle-K/D/N``     the same at a fixed tree of top-k K, depth D, N nodes (``--trees``),
* ``official-naive``       the official code's own plain decoding (``EaModel.naivegenerate``),
* ``official-eagle-K/D/N`` the official EAGLE-3 decoding (``EaModel.eagenerate``) at each tree.

The official code runs through ``official_eagle.py`` (a checkout of the repository, loaded as it
is; five transformers-5 differences bridged there, none in its algorithm). Each call is timed on
the wall clock from token ids in to token ids out (prefill included). The official calls stop
after the cycle that passes ``--max-new-tokens`` (they may return a few tokens more): every
method's rate counts the tokens it returned, and outputs compare over their common length.

Rows (``official_eagle.csv``, with device, versions, date, commit and the official checkout's
commit) per set and method: tokens / s, ours-eagle's speedup over it, τ (tokens per cycle of a
tree; official: new tokens / cycles), and how many prompts' outputs equal ours-ar's and the
method's own plain decoding's. Table in ``official_eagle.json``, bars in ``official_eagle.png``.

    python bench/e2e/bench_official_eagle.py --official-eagle ~/src/EAGLE --prompts 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import load_prompts  # noqa: E402
from common import append_rows, environment  # noqa: E402

from eagle_kernels.cli import DTYPES, _tree  # noqa: E402
from eagle_kernels.runtime.api import from_pretrained  # noqa: E402
from eagle_kernels.runtime.drafting import TreeConfig  # noqa: E402


def tree_name(tree: TreeConfig) -> str:
    return f"{tree.top_k}/{tree.depth}/{tree.total_tokens}"


def cut(tokens: list[int], eos: list[int], limit: int) -> list[int]:
    """``tokens`` up to ``limit`` and up to the first EOS (kept)."""
    tokens = tokens[:limit]
    for position, token in enumerate(tokens):
        if token in eos:
            return tokens[:position + 1]
    return tokens


def same_output(a: list[int], b: list[int]) -> bool:
    """Equal, both cut by :func:`cut` (the official calls return a few tokens past the limit,
    which the cut drops; an output that stopped short without EOS differs)."""
    return a == b


@contextlib.contextmanager
def fixed_tree(generator, tree: TreeConfig | None):
    """Speculative calls at ``tree`` inside the block, every cycle the head's tree as in the
    official code (no tree budget, no context drafts in place of a tree); None: as loaded.
    The settings are restored after the block."""
    engine = generator.engine
    saved = engine.tree, engine.tree_policy, engine.prompt_lookup
    if tree is not None:
        engine.tree, engine.tree_policy, engine.prompt_lookup = tree, None, False
    try:
        yield
    finally:
        engine.tree, engine.tree_policy, engine.prompt_lookup = saved


def ours(generator, tree: TreeConfig | None, speculative: bool):
    def call(ids: list[int], max_new_tokens: int) -> tuple[list[int], int, int, float]:
        with fixed_tree(generator, tree):
            result = generator.engine.generate([ids], max_new_tokens,
                                               eos_token_ids=generator.eos_token_ids(),
                                               speculative=speculative)
        stats = result.stats
        # cycles of a tree and their tokens (a plain call's steps are no cycles)
        histogram = stats.accepted_histogram if stats.mode == "speculative" else []
        return (result.tokens[0], sum(histogram),
                sum((accepted + 1) * count for accepted, count in enumerate(histogram)),
                stats.capture_seconds)
    return call


def official(model, tree: TreeConfig | None, device: str):
    import official_eagle

    def call(ids: list[int], max_new_tokens: int) -> tuple[list[int], int, int, float]:
        tokens = torch.tensor([ids], device=device)
        if tree is None:
            out = model.naivegenerate(tokens, temperature=0.0, max_new_tokens=max_new_tokens)
            return out[0, len(ids):].tolist(), 0, 0, 0.0
        official_eagle.set_tree(model, (tree.top_k, tree.depth, tree.total_tokens))
        # new tokens: what its cycles appended (each its root and the accepted drafts)
        out, new_tokens, last_cycle = model.eagenerate(
            tokens, temperature=0.0, max_new_tokens=max_new_tokens, log=True)
        return out[0, len(ids):].tolist(), last_cycle + 1, int(new_tokens), 0.0
    return call


def methods(generator, model, trees: list[TreeConfig], device: str = "cpu") -> dict:
    """Method name -> (call, name of its own plain decoding). Every call returns its tokens as
    a list: a GPU's work is done when it returns."""
    table = {"ours-ar": (ours(generator, None, False), "ours-ar"),
             "ours-eagle": (ours(generator, None, True), "ours-ar")}
    for tree in trees:
        table[f"ours-eagle-{tree_name(tree)}"] = (ours(generator, tree, True), "ours-ar")
    table["official-naive"] = (official(model, None, device), "official-naive")
    for tree in trees:
        table[f"official-eagle-{tree_name(tree)}"] = (official(model, tree, device),
                                                       "official-naive")
    return table


def run_set(table: dict, prompts: list[list[int]], eos: list[int], max_new_tokens: int,
            label: str = "") -> dict:
    """Per method: tokens, seconds, cycles of a tree and their tokens, and the prompts whose
    output equals ours-ar's / the method's own plain decoding's."""
    names = list(table)
    totals = {name: {"own_plain": table[name][1], "tokens": 0, "seconds": 0.0, "cycles": 0,
                     "tree_tokens": 0, "capture_seconds": 0.0, "same_as_ours_ar": 0,
                     "same_as_own_plain": 0} for name in names}
    for number, ids in enumerate(tqdm(prompts, desc=label or "prompts", disable=not label)):
        order = names[number % len(names):] + names[:number % len(names)]
        outputs = {}
        for name in order:
            start = time.perf_counter()
            tokens, cycles, tree_tokens, capture = table[name][0](ids, max_new_tokens)
            seconds = time.perf_counter() - start
            total = totals[name]
            total["tokens"] += len(tokens)
            total["seconds"] += seconds
            total["cycles"] += cycles
            total["tree_tokens"] += tree_tokens
            total["capture_seconds"] += capture
            outputs[name] = cut(tokens, eos, max_new_tokens)
        for name in names:
            totals[name]["same_as_ours_ar"] += same_output(outputs[name], outputs["ours-ar"])
            totals[name]["same_as_own_plain"] += same_output(
                outputs[name], outputs[totals[name]["own_plain"]])
    return totals


def rows_of(set_name: str, totals: dict, prompts: int, args) -> list[dict]:
    rate = {name: t["tokens"] / t["seconds"] for name, t in totals.items()}
    rows = []
    for name, total in totals.items():
        rows.append({
            "set": set_name, "method": name, "prompts": prompts,
            "max_new_tokens": args.max_new_tokens, "tokens": total["tokens"],
            "seconds": round(total["seconds"], 3),
            "tokens_per_second": round(rate[name], 2),
            "ours_eagle_speedup_over_this": round(rate["ours-eagle"] / rate[name], 3),
            "speedup_over_own_plain": round(rate[name] / rate[total["own_plain"]], 3),
            # tokens per cycle of a tree (a verify pass of drafts: ours-eagle's plain steps
            # are none)
            "tau": round(total["tree_tokens"] / total["cycles"], 3) if total["cycles"] else "",
            # of the seconds, CUDA-graph capture (ours on a GPU: each call captures its loop)
            "capture_seconds": round(total["capture_seconds"], 3),
            "identical_to_ours_ar": f"{total['same_as_ours_ar']}/{prompts}",
            "identical_to_own_plain": f"{total['same_as_own_plain']}/{prompts}",
            "draft": args.draft or "bundled", "target_weights": args.target_weights,
            "official_commit": args.official_commit})
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'set':<11}{'method':<26}{'tok/s':>8}{'x own AR':>10}{'ours-eagle x':>14}"
          f"{'tau':>7}{'== ours-ar':>12}{'== own AR':>11}")
    for row in rows:
        print(f"{row['set']:<11}{row['method']:<26}{row['tokens_per_second']:>8}"
              f"{row['speedup_over_own_plain']:>10}{row['ours_eagle_speedup_over_this']:>14}"
              f"{row['tau']!s:>7}{row['identical_to_ours_ar']:>12}"
              f"{row['identical_to_own_plain']:>11}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(row["set"] for row in rows))
    names = list(dict.fromkeys(row["method"] for row in rows))
    figure, axes = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [next(r["tokens_per_second"] for r in rows
                       if r["set"] == s and r["method"] == name) for s in sets]
        axes.bar([j + i * width for j in range(len(sets))], values, width, label=name)
    axes.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets)
    axes.set_yscale("log")
    axes.set_ylabel("tokens / s (batch 1, greedy, log scale)")
    axes.set_title(f"ours vs the official EAGLE code, {environment()['device']}")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def checkout_commit(repo: Path) -> str:
    """HEAD of the checkout at ``repo``; "unknown" where ``repo`` is not the top of one (a
    folder inside another repository would give that repository's commit)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True,
                              capture_output=True, text=True).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != repo.resolve():
            return "unknown"
        return git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--official-eagle", required=True, type=Path,
                        help="a checkout of github.com/SafeAILab/EAGLE")
    parser.add_argument("--official-commit", help="its commit, where the folder is not a git "
                        "checkout (default: git rev-parse HEAD there)")
    parser.add_argument("--sets", nargs="+", default=["humaneval", "sharegpt"],
                        help="humaneval, sharegpt (held-out split) or a question.jsonl path")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--trees", type=_tree, nargs="+", default=[TreeConfig(10, 6, 60),
                                                                   TreeConfig(1, 1, 2)],
                        help="fixed trees TOP_K,DEPTH,TOTAL_TOKENS both codes run")
    parser.add_argument("--draft", help="EAGLE-3 head dir (default: the bundled head)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--target-weights", choices=("packs", "fp32"), default="packs",
                        help="ours on a CPU: the target's GEMMs over its exact GGUF block packs "
                        "(the default, 112 MB a step) or over its fp32 values (538 MB, what "
                        "the official code reads): separates the packs from the rest")
    parser.add_argument("--out", default="bench/results/local")
    parser.add_argument("--smoke", action="store_true", help="1 prompt per set, 8 tokens")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompts, args.max_new_tokens = 1, 8
    if any(not isinstance(tree, TreeConfig) for tree in args.trees):
        parser.error("--trees: expected TOP_K,DEPTH,TOTAL_TOKENS triples, not 'auto'")
    if args.target_weights == "fp32" and args.device != "cpu":
        parser.error(f"--target-weights fp32: the CPU's choice of packs; on {args.device} ours "
                     "reads the checkpoint in --dtype anyway")
    args.official_commit = args.official_commit or checkout_commit(args.official_eagle)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import official_eagle

    from eagle_kernels.runtime.api import DEFAULT_HEAD
    from eagle_kernels.runtime.default_model import default_model_dir

    dtype = DTYPES[args.dtype]
    if args.target_weights == "fp32":  # before anything is packed
        from eagle_kernels.ops import decoder

        decoder.PACK_Q4_EXACT = decoder.PACK_Q8_EXACT = False
    # "default": the tree budget on a CPU, 10/6/60 in CUDA graphs on a GPU (from_pretrained)
    generator = from_pretrained(draft=args.draft, dtype=dtype, device=args.device,
                                tree="default")
    model = official_eagle.load(args.official_eagle, default_model_dir(),
                                args.draft or DEFAULT_HEAD, (10, 6, 60), dtype, args.device)
    table = methods(generator, model, args.trees, args.device)
    eos = generator.eos_token_ids()
    first = [generator.encode(load_prompts(args.sets[0], 1)[0])]
    run_set(table, first, eos, 4)  # untimed: first-call costs of every method
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python bench/e2e/bench_official_eagle.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    rows = []
    for name in args.sets:  # each set's rows written when it ends (a stage step may be cut)
        prompts = [generator.encode(prompt) for prompt in load_prompts(name, args.prompts)]
        totals = run_set(table, prompts, eos, args.max_new_tokens, label=name)
        new_rows = rows_of(name, totals, len(prompts), args)
        rows += new_rows
        append_rows(out / "official_eagle.csv", new_rows)
        (out / "official_eagle.json").write_text(json.dumps(
            {"environment": environment(), "command": command, "rows": rows}, indent=2))
        plot(rows, out / "official_eagle.png")
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
