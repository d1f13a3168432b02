"""Batched calls on the CPU, before / after b043d9c, in one process (alternating rounds).

    .venv/bin/python bench/results/2026-11-27h_cpu-2core/ab_batch.py > ab_batch.txt

"before" puts back what b043d9c changed, by patching the new code: the tree budget costs a
call at any batch as at the batch it measured (1), context drafts are taken at any batch
whatever their verify costs, and their payoff check counts every recorded token. "after" is
the code as committed. "ar" is plain decoding. Each round runs the three on the same prompt
groups in a rotating order; tokens/s = new tokens / wall seconds of the calls. Prints, per
batch size, each round's ratio to "ar" and their medians.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from eagle_kernels.data import humaneval_prompts, sharegpt_prompts  # noqa: E402
from eagle_kernels.runtime import lookup, tree_budget  # noqa: E402
from eagle_kernels.runtime.api import from_pretrained  # noqa: E402

ROUNDS, NEW_TOKENS, BATCHES = 3, 96, (1, 4, 8)


@contextlib.contextmanager
def before():
    saved = (tree_budget.AdaptiveTree._other_batch, lookup.LOOKUP_BATCH_MAX_VERIFY_STEPS,
             lookup.call_progress)
    tree_budget.AdaptiveTree._other_batch = lambda self: False
    lookup.LOOKUP_BATCH_MAX_VERIFY_STEPS = math.inf
    lookup.call_progress = sum
    try:
        yield
    finally:
        (tree_budget.AdaptiveTree._other_batch, lookup.LOOKUP_BATCH_MAX_VERIFY_STEPS,
         lookup.call_progress) = saved


def rate(generator, groups, speculative: bool) -> tuple[float, list]:
    tokens, seconds, outputs = 0, 0.0, []
    for group in groups:
        start = time.perf_counter()
        out = generator.generate(group, max_new_tokens=NEW_TOKENS, speculative=speculative)
        seconds += time.perf_counter() - start
        tokens += sum(out.stats.new_tokens)
        outputs += out.tokens
    return tokens / seconds, outputs


def main() -> None:
    generator = from_pretrained()
    print(generator.budget.report())
    prompts = sharegpt_prompts(8, split="heldout") + humaneval_prompts(8)
    for batch in BATCHES:
        groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
        ratios = {"before": [], "after": []}
        for round_ in range(ROUNDS):
            order = ["before", "after", "ar"]
            order = order[round_ % 3:] + order[:round_ % 3]
            rates, outputs = {}, {}
            for name in order:
                with before() if name == "before" else contextlib.nullcontext():
                    rates[name], outputs[name] = rate(generator, groups, name != "ar")
            assert outputs["before"] == outputs["after"] == outputs["ar"], "outputs differ"
            for name in ratios:
                ratios[name].append(rates[name] / rates["ar"])
            print(f"batch {batch} round {round_}: ar {rates['ar']:.1f} tokens/s, before "
                  f"{ratios['before'][-1]:.3f}x, after {ratios['after'][-1]:.3f}x", flush=True)
        print(f"batch {batch}: median before {statistics.median(ratios['before']):.3f}x, after "
              f"{statistics.median(ratios['after']):.3f}x plain decoding (outputs identical)",
              flush=True)


if __name__ == "__main__":
    main()
