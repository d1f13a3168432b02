"""EAGLE-2 dynamic draft trees, built with the draft head and :mod:`eagle_kernels.ops`.

One cycle of drafting, for B sequences at once (every shape is fixed by the tree settings, so
the whole function can be captured in a CUDA graph once kernels back the ops):

1. the head's last committed output (``root_hidden``) gives the root's top_k children;
2. ``depth`` expansion steps: the top_k frontier nodes (all at the same position) attend to the
   head's cache plus their drafted ancestors (packed mask over the drafted keys), each proposes
   top_k children (fused log-softmax + top-k), and the top_k best cumulative scores form the
   next frontier (:func:`eagle_kernels.ops.eagle2_expand`);
3. the best ``total_tokens - 1`` of all drafted candidates become the tree, in topological
   order, with mask and paths (:func:`eagle_kernels.ops.eagle2_rerank`).

Position convention (as the official EAGLE code): the head's entry at position t pairs the
target's feature at t with the token at t + 1, so the head cache and the target cache hold the
same number of entries, and frontier nodes of depth d + 1 sit at ``lens + d``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .. import ops
from ..ops._validate import check_int
from ..ops.reference import mask_words, pack_tree_mask
from .draft_heads import DraftHead
from .kv_cache import KVCache


TREE_MAX_TOKENS = 1024  # nodes a tree may keep (the Triton tree kernels' limit), and its depth
TREE_MAX_TOP_K = 64     # children per node: top_k^2 * depth candidates are scored per tree


@dataclass(frozen=True)
class TreeConfig:
    """EAGLE-2 tree settings: children per node, expansion steps, nodes kept (root included).

    The deepest node has depth ``depth + 1`` (root children come from the committed state,
    each expansion step adds one level), as in the official code.
    """

    top_k: int = 10
    depth: int = 6
    total_tokens: int = 60

    def __post_init__(self):
        check_int("top_k", self.top_k, 1, TREE_MAX_TOP_K)
        check_int("depth", self.depth, 0, TREE_MAX_TOKENS)
        check_int("total_tokens", self.total_tokens, 1, TREE_MAX_TOKENS)
        if self.total_tokens - 1 > self.num_candidates:
            raise ValueError(f"total_tokens: expected <= {self.num_candidates + 1} (1 + the "
                             f"{self.num_candidates} candidates top_k={self.top_k}, "
                             f"depth={self.depth} draft), got {self.total_tokens}")

    @property
    def num_candidates(self) -> int:
        return self.top_k + self.depth * self.top_k * self.top_k

    @property
    def max_depth(self) -> int:
        """Deepest possible node; ``paths`` and accept results are ``max_depth + 1`` wide."""
        return min(self.depth + 1, self.total_tokens - 1)

    @property
    def expansion_steps(self) -> int:
        """Head forwards one drafting runs after the root's children: a node at level L is kept
        only with its L - 1 ancestors (``total_tokens - 1`` nodes at most), so levels past
        ``total_tokens - 1`` are never drafted (1/1/2: none)."""
        return max(0, self.max_depth - 1)

    @property
    def drafted_keys(self) -> int:
        """Head-cache entries one drafting cycle writes past the committed length: ``top_k``
        per expansion step (the root's children are not written)."""
        return self.expansion_steps * self.top_k


# Packed causal masks are rebuilt from a dense [T, T] bool each time otherwise; keep the few
# lengths a workload repeats (commit widths, a prompt length) in a small LRU so that a long run
# of distinct prompt lengths cannot grow memory without bound.
CAUSAL_MASK_CACHE_SIZE = 32


@functools.lru_cache(maxsize=CAUSAL_MASK_CACHE_SIZE)
def _packed_causal_mask(count: int, device: str) -> torch.Tensor:
    """[count, ceil(count/32)] int32, shared between calls: callers never write to it."""
    dense = torch.tril(torch.ones(count, count, dtype=torch.bool, device=device))
    return pack_tree_mask(dense)


def causal_tree_mask(batch: int, count: int, device: torch.device) -> torch.Tensor:
    """Packed mask of a chain of ``count`` tokens (each sees itself and all before): causal."""
    # A copy, so the cached tensor is never handed out for writing (at batch 1 .contiguous()
    # of the expanded view would return the cached tensor itself, an inference tensor outside
    # inference_mode too if first built inside it). ~2 us more at batch 1, once a cycle.
    mask = _packed_causal_mask(count, str(device))
    return mask.unsqueeze(0).expand(batch, -1, -1).clone()


@functools.lru_cache(maxsize=CAUSAL_MASK_CACHE_SIZE)
def _frontier_bits(top_k: int, depth: int, device: str) -> torch.Tensor:
    """[max(depth, 1), top_k, words] int32, shared (callers never write to it): row ``slot`` of
    step ``s`` has the packed bit of drafted key ``s * top_k + slot``, the key a frontier node
    of step ``s`` writes into the head's cache. A frontier's mask is its parent's row OR this."""
    keys = max(depth, 1) * top_k
    own_key = torch.eye(keys, dtype=torch.bool).view(-1, top_k, keys)
    return pack_tree_mask(own_key).to(device)


def gather_rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``values[b, index[b, k]]`` of ``values`` [B, T, C] for ``index`` [B, K] -> [B, K, C]."""
    return values.gather(1, index.unsqueeze(-1).expand(-1, -1, values.shape[-1]))


def commit(head: DraftHead, cache: KVCache, tokens: torch.Tensor, hidden: torch.Tensor,
           counts: torch.Tensor) -> torch.Tensor:
    """Append ``counts[b]`` (feature, next token) pairs per sequence to the head's cache.

    ``tokens`` [B, W] and ``hidden`` [B, W, H] (already projected) are left-aligned, rows past
    ``counts[b]`` are padding: they are computed (causal mask, so they change nothing) and left
    past the committed length, where drafting overwrites them. Returns the head's output at
    each sequence's last committed pair [B, H], the state drafting starts from.
    """
    width = tokens.shape[1]
    steps = torch.arange(width, device=tokens.device)
    positions = cache.lens.to(torch.int64).unsqueeze(1) + steps
    out = head(tokens, hidden, positions, cache, causal_tree_mask(tokens.shape[0], width,
                                                                  tokens.device))
    last = (counts.to(torch.int64) - 1).clamp(min=0)
    cache.lens += counts.to(torch.int32)
    return gather_rows(out, last.unsqueeze(1)).squeeze(1)


def draft_tree(head: DraftHead, cache: KVCache, root_tokens: torch.Tensor,
               root_hidden: torch.Tensor, tree: TreeConfig) -> ops.DraftTree:
    """Draft one EAGLE-2 tree per sequence (``tree.total_tokens`` nodes, root first)."""
    batch, k = root_tokens.shape[0], tree.top_k
    device = root_tokens.device
    d2t = head.d2t_offsets()
    scores, tokens = ops.topk_log_softmax(head.draft_logits(root_hidden), k, d2t)
    roots = torch.full((batch, k), -1, dtype=torch.int32, device=device)
    if tree.expansion_steps == 0:  # 1/1/2, k/1/k+1: the root's children are the candidates
        # (the frontier state below and the concatenations cost ~0.1 ms of a ~0.7 ms draft on
        # 2 cores, measured right after a verify pass as a cycle runs it)
        return ops.eagle2_rerank(root_tokens, tokens, scores, roots, tree.total_tokens,
                                 tree.max_depth)[0]
    cand_tokens, cand_scores, cand_parents = [tokens], [scores], [roots]

    frontier_tokens, frontier_scores = tokens, scores
    frontier_hidden = root_hidden.unsqueeze(1).expand(-1, k, -1)
    frontier_ids = torch.arange(k, device=device).expand(batch, -1)  # candidate index
    own_bits = _frontier_bits(k, tree.depth, str(device))
    # packed: frontier slot -> drafted keys it sees; a copy, so the cached bits are never handed
    # to the head (at batch 1 .contiguous() of a view of them would return the view itself)
    ancestors = own_bits[0].expand(batch, -1, -1).clone()
    base = k
    for step in range(tree.expansion_steps):  # levels no tree of total_tokens can hold: none
        keys = (step + 1) * k
        positions = (cache.lens.to(torch.int64) + step).unsqueeze(1).expand(-1, k)
        out = head(frontier_tokens, frontier_hidden, positions, cache,
                   ancestors[:, :, :mask_words(keys)].contiguous(), tree_offset=step * k)
        logits = head.draft_logits(out)
        child_scores, child_tokens = ops.topk_log_softmax(logits.reshape(batch * k, -1), k, d2t)
        child_tokens = child_tokens.view(batch, k * k)
        scores_flat, next_index, next_scores = ops.eagle2_expand(
            frontier_scores, child_scores.view(batch, k, k), k)
        cand_tokens.append(child_tokens)
        cand_scores.append(scores_flat)
        cand_parents.append(frontier_ids.repeat_interleave(k, dim=1).to(torch.int32))
        if step + 1 < tree.depth:
            parent_slot = next_index // k
            frontier_tokens = child_tokens.gather(1, next_index)
            frontier_scores = next_scores
            frontier_hidden = gather_rows(out, parent_slot)
            frontier_ids = base + next_index
            ancestors = gather_rows(ancestors, parent_slot) | own_bits[step + 1]
        base += k * k
    drafted, _ = ops.eagle2_rerank(root_tokens, torch.cat(cand_tokens, 1),
                                   torch.cat(cand_scores, 1), torch.cat(cand_parents, 1),
                                   tree.total_tokens, tree.max_depth)
    return drafted
