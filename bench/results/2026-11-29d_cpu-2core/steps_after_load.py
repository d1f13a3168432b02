"""Plain decoding steps (target over one token + logits, context 256) run back to back for 4 s
right after from_pretrained() returns (the model loaded, the tree budget's start-up timing
done): the median step of each quarter second, in ms.

    python bench/results/2026-11-29d_cpu-2core/steps_after_load.py > steps_after_load.txt
"""
import statistics
import time

import torch

from eagle_kernels.ops._validate import no_value_checks, weights_unchanged
from eagle_kernels.runtime import tree_budget
from eagle_kernels.runtime.api import from_pretrained

generator = from_pretrained()
print(f"start-up timing: plain step {generator.budget.step_seconds * 1e3:.2f} ms")
with torch.inference_mode(), no_value_checks(), weights_unchanged():
    step = tree_budget._step_call(generator.engine.target, 256, 1)
    medians, bucket = [], []
    start = began = time.perf_counter()
    while time.perf_counter() - began < 4.0:
        tick = time.perf_counter()
        step()
        bucket.append(time.perf_counter() - tick)
        if time.perf_counter() - start >= 0.25:
            medians.append(statistics.median(bucket))
            bucket, start = [], time.perf_counter()
print("steps in a row, median of each 0.25 s (ms):", " ".join(f"{m * 1e3:.2f}" for m in medians))
