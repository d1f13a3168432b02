"""Plain decoding steps (target over one token + logits, context 256) timed one by one right
after a cycle of a 16-node tree and of a 1/1/2 tree (drafting + verify), medians over 12 repeats:
how many steps it takes a step to cost what it costs in a row of steps (the tree budget's
SETTLE_SECONDS, bench_cpu's InARow).

    python bench/results/2026-11-29d_cpu-2core/steps_after_a_cycle.py > steps_after_a_cycle.txt
"""
import statistics
import time

import torch

from eagle_kernels.ops._validate import no_value_checks, weights_unchanged
from eagle_kernels.runtime import tree_budget
from eagle_kernels.runtime.api import from_pretrained
from eagle_kernels.runtime.drafting import TreeConfig

generator = from_pretrained()
target, head = generator.engine.target, generator.engine.head
with torch.inference_mode(), no_value_checks(), weights_unchanged():
    step = tree_budget._step_call(target, 256, 1)
    for name, tree in (("6/4/16", TreeConfig(6, 4, 16)), ("1/1/2", TreeConfig(1, 1, 2))):
        draft, verify = tree_budget.cycle_calls(target, head, tree, 256, 1)
        for _ in range(3):
            step()
        columns = [[] for _ in range(24)]
        for _ in range(12):
            draft()
            verify()
            for column in columns:
                start = time.perf_counter()
                step()
                column.append(time.perf_counter() - start)
        print(f"after a {name:6s} cycle, steps 1..24 (ms):",
              " ".join(f"{statistics.median(c) * 1e3:.2f}" for c in columns))
