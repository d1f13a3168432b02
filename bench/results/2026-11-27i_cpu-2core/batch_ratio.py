"""Batched calls on the CPU: speculative (the default measured tree) against plain decoding,
in one process, alternating, after 52d5822 (no probe call where no tree could pay).

    .venv/bin/python bench/results/2026-11-27i_cpu-2core/batch_ratio.py > batch_ratio.txt

16 held-out prompts (8 ShareGPT + 8 HumanEval) x 96 new tokens in groups of the batch size;
ROUNDS rounds, each running both modes on the same groups, the order alternating by round;
tokens/s = new tokens / wall seconds of the calls. Prints each round's ratio, their median,
and how many speculative calls ran tree cycles (probes included).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from eagle_kernels.data import humaneval_prompts, sharegpt_prompts  # noqa: E402
from eagle_kernels.runtime.api import from_pretrained  # noqa: E402

ROUNDS, NEW_TOKENS, BATCHES = 5, 96, (4, 8)


def rate(generator, groups, speculative: bool) -> tuple[float, list, int]:
    tokens, seconds, outputs, with_cycles = 0, 0.0, [], 0
    for group in groups:
        start = time.perf_counter()
        out = generator.generate(group, max_new_tokens=NEW_TOKENS, speculative=speculative)
        seconds += time.perf_counter() - start
        tokens += sum(out.stats.new_tokens)
        outputs += out.tokens
        with_cycles += bool(out.stats.tree_cycles)
    return tokens / seconds, outputs, with_cycles


def main() -> None:
    generator = from_pretrained()
    print(generator.budget.report())
    prompts = sharegpt_prompts(8, split="heldout") + humaneval_prompts(8)
    for batch in BATCHES:
        groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
        ratios, calls_with_cycles, calls = [], 0, 0
        for round_ in range(ROUNDS):
            order = (True, False) if round_ % 2 else (False, True)
            rates, outputs = {}, {}
            for speculative in order:
                rates[speculative], outputs[speculative], cycles = rate(generator, groups,
                                                                        speculative)
                if speculative:
                    calls_with_cycles, calls = calls_with_cycles + cycles, calls + len(groups)
            assert outputs[True] == outputs[False], "outputs differ"
            ratios.append(rates[True] / rates[False])
            print(f"batch {batch} round {round_}: plain {rates[False]:.1f} tokens/s, "
                  f"speculative {ratios[-1]:.3f}x", flush=True)
        print(f"batch {batch}: median {statistics.median(ratios):.3f}x plain decoding (outputs "
              f"identical); {calls_with_cycles} of {calls} speculative calls ran tree cycles",
              flush=True)


if __name__ == "__main__":
    main()
