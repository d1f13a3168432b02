"""Hardware-aware tree budget: pick total_tokens / depth from timings on this device.

A verify pass over N tree nodes costs about one decode step where the device is memory-bound
(an H100 at batch 1 up to N ~ 64) and about N steps where it is compute-bound (a CPU). The
best tree is the one that maximises expected tokens per cycle over cycle time:

    rate(N, depth) = tau(N, depth) / (t_draft(depth) + t_verify(N))

``t_verify`` and the per-step drafting time are measured here (target forward over N nodes at
the given context; one draft-head step over top_k rows). ``tau`` comes from a heuristic model of a dynamic tree with per-token acceptance ``alpha``
(the chance the target agrees with the draft's best child): a tree of N nodes over
``depth + 1`` levels holds ``w = (N - 1) / (depth + 1)`` nodes per level, of which about
``sqrt(w)`` hang under the path the target takes; each extra sibling there removes a quarter
of the remaining miss probability, and levels accept independently. With alpha 0.7 this gives
tau ~ 4.4 for EAGLE-2's 60 nodes / depth 7, in line with published EAGLE-2 numbers. ``alpha``
defaults to 0.7; pass a measured one when you have it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..ops.reference import pack_tree_mask
from .drafting import TreeConfig, causal_tree_mask

CANDIDATE_NODES = (4, 8, 12, 16, 24, 32, 48, 60, 80)
CANDIDATE_DEPTHS = (2, 3, 4, 5, 6, 7)


@dataclass
class TreeBudget:
    """The chosen tree and the measurements behind it."""

    tree: TreeConfig
    verify_seconds: dict[int, float]
    draft_step_seconds: float
    expected_tau: float
    alpha: float

    def report(self) -> str:
        times = ", ".join(f"N={n}: {t * 1e3:.1f} ms" for n, t in self.verify_seconds.items())
        return (f"tree budget: top_k={self.tree.top_k} depth={self.tree.depth} "
                f"total_tokens={self.tree.total_tokens} (expected tau {self.expected_tau:.2f} at "
                f"alpha {self.alpha}); verify forward {times}; draft step "
                f"{self.draft_step_seconds * 1e3:.1f} ms")


def expected_tau(nodes: int, depth: int, alpha: float, top_k: int) -> float:
    """Expected tokens per cycle (accepted + bonus) of a tree, under the model above."""
    levels = min(depth + 1, nodes - 1)
    if levels <= 0:
        return 1.0
    per_level = (nodes - 1) / levels
    siblings = min(per_level ** 0.5, top_k)
    level_accept = 1.0 - (1.0 - alpha) * 0.75 ** (siblings - 1.0)
    return sum(level_accept ** level for level in range(levels + 1))


def _median_seconds(fn, repeats: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure_verify(target, nodes: int, context: int, batch: int, repeats: int) -> float:
    """Median seconds of one target forward over ``nodes`` chain nodes after ``context``."""
    cache = target.allocate_cache(batch, context + nodes)
    cache.lens.fill_(context)
    ids = torch.zeros(batch, nodes, dtype=torch.int64, device=target.device)
    positions = torch.arange(context, context + nodes, device=target.device).expand(batch, -1)
    mask = causal_tree_mask(batch, nodes, target.device)
    with torch.inference_mode():
        return _median_seconds(lambda: target(ids, positions, cache, mask), repeats,
                               target.device)


def measure_draft_step(head, top_k: int, context: int, batch: int, repeats: int) -> float:
    """Median seconds of one drafting step: head forward + logits over ``top_k`` rows."""
    cache = head.allocate_cache(batch, context + top_k)
    cache.lens.fill_(context)
    device = head.fc.weight.device
    ids = torch.zeros(batch, top_k, dtype=torch.int64, device=device)
    hidden = torch.zeros(batch, top_k, head.config.hidden_size, dtype=head.fc.weight.dtype,
                         device=device)
    positions = torch.full((batch, top_k), context, dtype=torch.int64, device=device)
    mask = pack_tree_mask(torch.eye(top_k, dtype=torch.bool, device=device)).expand(
        batch, -1, -1).contiguous()
    with torch.inference_mode():
        return _median_seconds(
            lambda: head.draft_logits(head(ids, hidden, positions, cache, mask)), repeats, device)


def choose_tree(target, head, batch: int = 1, context: int = 256, alpha: float = 0.7,
                top_k: int = 10, repeats: int = 3) -> TreeBudget:
    """Measure, then return the tree with the best expected tokens per second."""
    verify = {n: measure_verify(target, n, context, batch, repeats) for n in CANDIDATE_NODES}
    step = measure_draft_step(head, top_k, context, batch, repeats)
    best, best_rate = None, -1.0
    for nodes in CANDIDATE_NODES:
        for depth in CANDIDATE_DEPTHS:
            k = min(top_k, max(nodes - 1, 1))
            tree = TreeConfig(top_k=k, depth=depth, total_tokens=min(nodes, k + depth * k * k + 1))
            tau = expected_tau(tree.total_tokens, depth, alpha, k)
            rate = tau / (verify[nodes] + (depth + 1) * step)
            if rate > best_rate:
                best, best_rate = (tree, tau), rate
    return TreeBudget(best[0], verify, step, best[1], alpha)
