"""Start-up of the default generator on the CPU: loading, the first call (it packs the target's
weights), and the tree budget's measurement with and without pruning (alternating, twice each).

    .venv/bin/python bench/results/2026-11-27h_cpu-2core/startup.py > startup.txt
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

start = time.perf_counter()
from eagle_kernels.runtime.api import from_pretrained  # noqa: E402
from eagle_kernels.runtime.tree_budget import choose_tree  # noqa: E402

generator = from_pretrained(tree=None)
loaded = time.perf_counter()
generator.generate("Hi", max_new_tokens=1, speculative=False)  # packs every weight
first = time.perf_counter()
print(f"import + load {loaded - start:.2f} s, first call (packing) {first - loaded:.2f} s")
engine = generator.engine
for round_ in range(2):
    for prune in (True, False):
        began = time.perf_counter()
        policy = choose_tree(engine.target, engine.head, prune=prune)
        print(f"round {round_}: choose_tree(prune={prune}) {time.perf_counter() - began:.2f} s, "
              f"{len(policy.trees)} trees kept, picks "
              f"{policy.current.top_k}/{policy.current.depth}/{policy.current.total_tokens}",
              flush=True)
