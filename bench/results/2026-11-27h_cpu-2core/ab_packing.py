"""Packing the default target's weights (what a generator's first call does), before / after
c022156, alternating in one process: "before" is _exact_levels as it was (every neighbour scale
tried, torch's bool all() per block), patched in; "after" the committed one.

    .venv/bin/python bench/results/2026-11-27h_cpu-2core/ab_packing.py > ab_packing.txt
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from eagle_kernels.ops import decoder  # noqa: E402
from eagle_kernels.runtime.api import from_pretrained  # noqa: E402


def exact_levels_before(blocks, nearest, offset, levels):
    """ops/decoder.py _exact_levels at ac80561."""
    q = torch.zeros_like(blocks)
    d = torch.zeros_like(blocks[..., :1])
    found = torch.zeros_like(d, dtype=torch.bool)
    for step in (0, 1, -1):
        candidate = (nearest + step).view(torch.float16).float()
        safe = torch.where(candidate > 0, candidate, torch.ones_like(candidate))
        level = ((blocks - offset) / safe).round().clamp(*levels)
        rebuilt = candidate * level + offset
        exact = (rebuilt.view(torch.int32) == blocks.view(torch.int32)).all(-1, keepdim=True)
        real = candidate.double() * level.double() + torch.as_tensor(offset).double()
        exact &= (real == blocks.double()).all(-1, keepdim=True)
        exact &= torch.isfinite(candidate) & ~found
        q = torch.where(exact, level, q)
        d = torch.where(exact, candidate, d)
        found |= exact
    return (q, d) if bool(found.all()) else None


def pack_all(weights) -> tuple[float, list]:
    start = time.perf_counter()
    packs = [decoder.pack_weight(w) for w in weights]
    return time.perf_counter() - start, packs


def main() -> None:
    target = from_pretrained(draft="none").engine.target
    weights = [p for p in target.parameters() if p.dim() == 2]
    after_function = decoder._exact_levels
    seconds = {"before": [], "after": []}
    for _ in range(3):
        for name, function in (("before", exact_levels_before), ("after", after_function)):
            decoder._exact_levels = function
            spent, packs = pack_all(weights)
            seconds[name].append(spent)
            if name == "before":
                reference = packs
            else:
                assert all(torch.equal(a, b) for a, b in zip(reference, packs)), "packs differ"
    decoder._exact_levels = after_function
    print(f"{len(weights)} weights, {sum(w.numel() for w in weights) / 1e6:.1f} M values")
    for name, values in seconds.items():
        print(f"{name}: median {statistics.median(values):.2f} s ({' '.join(f'{v:.2f}' for v in values)})")
    print(f"after / before: {statistics.median(seconds['after']) / statistics.median(seconds['before']):.2f}x "
          f"(packs identical)")


if __name__ == "__main__":
    main()
