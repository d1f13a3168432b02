"""Draft-tree growth: fused log-softmax + top-k, EAGLE-2 expansion and rerank.

Public ops with the contracts of the same-named functions in :mod:`eagle_kernels.ops.reference`:
:func:`topk_log_softmax`, :func:`eagle2_expand`, :func:`eagle2_rerank`. All orders are
deterministic: best first, equal values by lowest index. Backends: ``torch`` (reference);
Triton and CUDA kernels to come.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import register, resolve
from ._validate import (FLOAT_DTYPES, check_int, check_logits, check_parents, check_range,
                        check_same_device, check_tensor, value_checks_enabled)
from .reference import DraftTree


def topk_log_softmax(logits, k: int, d2t=None, backend: str = "auto"):
    """Top-k log-probabilities of vocabulary rows.

    Parameters
    ----------
    logits : [R, V] float16 / bfloat16 / float32, contiguous (-inf allowed, not NaN).
    k : int, 1 <= k <= V.
    d2t : [V] int64, optional; draft id i maps to target id ``i + d2t[i]`` (EAGLE-3).
    backend : "auto", "cuda", "triton" or "torch".

    Returns
    -------
    log_probs : [R, k] float32, descending.   token_ids : [R, k] int64.
    """
    check_tensor("logits", logits, FLOAT_DTYPES, (None, None))
    vocab = logits.shape[1]
    check_int("k", k, 1, vocab)
    check_logits("logits", logits)
    if d2t is not None:
        check_tensor("d2t", d2t, (torch.int64,), (vocab,), logits.device)
        if value_checks_enabled() and bool(((torch.arange(vocab, device=d2t.device) + d2t) < 0)
                                           .any()):
            raise ValueError("d2t: draft id + offset must be a non-negative target id")
    _, implementation = resolve("topk_log_softmax", backend, logits.device)
    return implementation(logits, k, d2t)


def eagle2_expand(frontier_scores, child_log_probs, top_k: int, backend: str = "auto"):
    """One EAGLE-2 expansion step (see :func:`reference.eagle2_expand`).

    Parameters
    ----------
    frontier_scores : [B, K] float32.   child_log_probs : [B, K, C] float32.
    top_k : int, 1 <= top_k <= K * C.

    Returns
    -------
    candidate_scores [B, K*C] float32, next_index [B, top_k] int64, next_scores [B, top_k] float32.
    """
    check_tensor("frontier_scores", frontier_scores, (torch.float32,), (None, None))
    batch, frontier = frontier_scores.shape
    check_tensor("child_log_probs", child_log_probs, (torch.float32,), (batch, frontier, None),
                 frontier_scores.device)
    check_int("top_k", top_k, 1, frontier * child_log_probs.shape[2])
    if value_checks_enabled() and bool(torch.isnan(child_log_probs).any()
                                       | torch.isnan(frontier_scores).any()):
        raise ValueError("child_log_probs: expected no NaN (frontier_scores too)")
    _, implementation = resolve("eagle2_expand", backend, frontier_scores.device)
    return implementation(frontier_scores, child_log_probs, top_k)


def eagle2_rerank(root_tokens, candidate_tokens, candidate_scores, candidate_parents,
                  num_nodes: int, max_depth: int | None = None,
                  backend: str = "auto") -> tuple[DraftTree, torch.Tensor]:
    """Best ``num_nodes - 1`` candidates -> a topologically ordered draft tree.

    Parameters
    ----------
    root_tokens : [B] int64.   candidate_tokens : [B, M] int64.
    candidate_scores : [B, M] float32 (non-increasing from parent to child).
    candidate_parents : [B, M] int32, ``-1 <= candidate_parents[b, i] < i``.
    num_nodes : int, 1 <= N <= M + 1.   max_depth : int, optional (default N - 1).

    Returns
    -------
    (DraftTree, selected [B, N - 1] int64); see :func:`reference.eagle2_rerank`.
    """
    check_tensor("candidate_tokens", candidate_tokens, (torch.int64,), (None, None))
    batch, candidates = candidate_tokens.shape
    device = candidate_tokens.device
    check_tensor("root_tokens", root_tokens, (torch.int64,), (batch,), device)
    check_tensor("candidate_scores", candidate_scores, (torch.float32,), (batch, candidates),
                 device)
    check_tensor("candidate_parents", candidate_parents, (torch.int32,), (batch, candidates),
                 device)
    check_same_device(candidate_tokens=candidate_tokens, root_tokens=root_tokens)
    check_int("num_nodes", num_nodes, 1, candidates + 1)
    check_range("root_tokens", root_tokens, 0, 2**62)
    check_range("candidate_tokens", candidate_tokens, 0, 2**62)
    with_root = torch.cat([torch.full((batch, 1), -1, dtype=torch.int32, device=device),
                           candidate_parents + 1], dim=1)
    check_parents("candidate_parents (as tree with the root prepended)", with_root)
    if value_checks_enabled() and bool(torch.isnan(candidate_scores).any()):
        raise ValueError("candidate_scores: expected no NaN")
    if max_depth is not None:
        check_int("max_depth", max_depth, 0)
    _, implementation = resolve("eagle2_rerank", backend, device)
    tree, selected = implementation(root_tokens, candidate_tokens, candidate_scores,
                                    candidate_parents, num_nodes, max_depth)
    return tree, selected


register("topk_log_softmax", "torch", reference.topk_log_softmax)
register("eagle2_expand", "torch", reference.eagle2_expand)
register("eagle2_rerank", "torch", reference.eagle2_rerank)
