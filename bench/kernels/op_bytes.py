"""Bytes each benchmarked op must move (read + written, each at least once): the numerator of
every row's memory floor (:func:`common.floor_us` divides them by the measured bandwidth).

One home, pure arithmetic (no GPU, no environment side effects: tests/test_bench_common.py
imports it). Counted from the ops' signatures (eagle_kernels/ops/*.py, the contracts in
eagle_kernels/ops/reference.py): every input the op needs and every output it returns, once;
never a kernel's own re-reads or scratch. Acceptance ops read every node's logits row (a
data-parallel call: which rows a sequence's outcome needs is only known after reading them).
"""

from __future__ import annotations

import torch

INT64, INT32, FP32 = 8, 4, 4


def acceptance_bytes(op: str, batch: int, nodes: int, vocab: int, logit_bytes: int,
                     width: int | None = None, path_entries: int = 0, rejected: int = 0) -> int:
    """One acceptance call over ``batch`` sequences of ``nodes`` nodes and ``vocab`` logits
    of ``logit_bytes`` each. Read: every node's target logits row and every drafted node's
    token (node 0, the root, is never compared); greedy_accept_tree the ``path_entries`` path
    entries that name a node; stochastic ops every drafted node's uniform and each sequence's
    bonus uniform (column 0 of accept_uniforms is unused), the tree op every drafted node's
    parent; stochastic_accept_chain q(x) of every drafted token (draft_probs, fp32) and, in
    each of the ``rejected`` sequences that reject a token, that node's whole draft row: the
    bonus is drawn from max(0, p - q), which needs all of it (:func:`rejected_chains`).
    Written: AcceptResult (output_tokens int64 and accepted_nodes int32 of ``width``, default
    ``nodes``: greedy_accept_tree's is the paths' D + 1; num_accepted int32)."""
    drafted = batch * (nodes - 1)
    read = batch * nodes * vocab * logit_bytes + drafted * INT64
    if op == "greedy_accept_chain":
        pass
    elif op == "greedy_accept_tree":
        if width is None:
            raise ValueError("greedy_accept_tree: width (the paths' D + 1) is required")
        read += path_entries * INT32
    elif op == "stochastic_accept_tree":
        read += drafted * INT32 + drafted * FP32 + batch * FP32
    elif op == "stochastic_accept_chain":
        read += drafted * FP32 + batch * FP32  # accept / bonus uniforms
        read += drafted * FP32 + rejected * (vocab - 1) * FP32  # q(x); the rejected rows' rest
    else:
        raise ValueError(f"unknown acceptance op {op!r}")
    width = nodes if width is None else width
    written = batch * width * (INT64 + INT32) + batch * INT32
    return read + written


def rejected_chains(tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor,
                    accept_uniforms: torch.Tensor) -> int:
    """How many sequences of a stochastic_accept_chain call at the default sampling
    (temperature 1, no top-k / top-p: p = softmax of the logits) reject a draft token, i.e.
    draw their bonus from a residual that needs a whole draft row: node i >= 1 is accepted
    iff ``accept_uniforms[b, i] * q(x) < p(x)`` with q = draft_probs[b, i - 1] and p the
    target at node i - 1 (reference.stochastic_accept_chain). From the inputs alone, so the
    floor does not depend on the kernel it measures."""
    logits = target_logits[:, :-1].float()
    drafted = tokens[:, 1:].unsqueeze(-1)
    log_p = logits.gather(-1, drafted) - torch.logsumexp(logits, -1, keepdim=True)
    q = draft_probs.float().gather(-1, drafted)
    accepted = accept_uniforms[:, 1:].unsqueeze(-1) * q < log_p.exp()
    return int((~accepted).squeeze(-1).any(-1).sum())


def attention_bytes(batch: int, queries: int, keys: int, q_heads: int, kv_heads: int, dim: int,
                    elem_bytes: int, mask_bytes: int = 0) -> int:
    """Attention of ``queries`` query rows over ``keys`` key rows per sequence: the K and V
    rows read, q read and the output written, plus ``mask_bytes``: the packed tree mask a
    tree_attention call reads (its cache_lens left out, as in :func:`kv_copy_bytes`)."""
    return (2 * batch * keys * kv_heads * dim * elem_bytes
            + 2 * batch * queries * q_heads * dim * elem_bytes + mask_bytes)


def rope_bytes(rotated: int, stored: int, positions: int, distinct_positions: int, dim: int,
               tables: int, elem_bytes: int) -> int:
    """apply_rope / rope_write_kv: ``rotated`` elements read and written (q, and k into the
    cache), ``stored`` elements read and written unrotated (v into the cache), the positions
    (int64) and, per distinct position, one row of ``dim`` from each of ``tables`` distinct
    tables (cos and sin: 2, or 1 when they are the same tensor); cache_lens left out, as in
    :func:`kv_copy_bytes`."""
    return (2 * (rotated + stored) * elem_bytes + positions * INT64
            + tables * distinct_positions * dim * elem_bytes)


def linear_bytes(rows: int, width: int, outs: tuple[int, ...], elem_bytes: int) -> int:
    """linear / linear_group (no bias): every weight and the input rows read once, the outputs
    written."""
    return (sum(outs) * width + rows * width + rows * sum(outs)) * elem_bytes


def rms_norm_bytes(rows: int, width: int, elem_bytes: int, residual: bool = True) -> int:
    """rms_norm: x (and residual) read, the weight read, normed (and x + residual) written."""
    arrays = 4 if residual else 2
    return (arrays * rows * width + width) * elem_bytes


def silu_mul_bytes(rows: int, width: int, elem_bytes: int) -> int:
    """silu_mul: gate and up read, the product written."""
    return 3 * rows * width * elem_bytes


def kv_copy_bytes(rows: int, row_bytes: int, caches: int) -> int:
    """compact_kv / write_kv: ``rows`` rows of ``row_bytes`` per cache read and written once
    (compact_kv: only the entries that move). The small index tensors (cache_lens, 4 bytes a
    sequence; compact_kv's accepted_nodes and num_accepted) are left out: a lower bound still."""
    return 2 * rows * row_bytes * caches


def topk_bytes(rows: int, vocab: int, logit_bytes: int, top_k: int) -> int:
    """topk_log_softmax: every logits row read, its top ``top_k`` written (fp32 log-probability
    and int64 index each)."""
    return rows * vocab * logit_bytes + rows * top_k * (FP32 + INT64)


def expand_bytes(batch: int, top_k: int, children: int) -> int:
    """eagle2_expand over ``top_k`` frontier nodes of ``children`` children each: the frontier
    scores and the children's log-probabilities read, every candidate's cumulative score
    written (fp32), the next frontier written (fp32 score and int64 index)."""
    return (batch * top_k * FP32 + 2 * batch * top_k * children * FP32
            + batch * top_k * (FP32 + INT64))


def rerank_bytes(batch: int, candidates: int, kept: int, tree_bytes: int) -> int:
    """eagle2_rerank keeping ``kept`` nodes in all (batch x (N - 1)): the roots (int64) and
    every candidate's score read, the kept candidates' tokens (int64) and parents (int32) read;
    the tree (``tree_bytes``, all its tensors) and the kept candidates' indices (int64)
    written."""
    return (batch * INT64 + batch * candidates * FP32 + kept * (INT64 + INT32) + tree_bytes
            + kept * INT64)


def build_tree_bytes(tree) -> int:
    """build_tree of a reference DraftTree: its parents read; its depth, mask and paths
    written (every tensor of the tree but the tokens and scores, which it neither reads nor
    writes)."""
    return sum(t.numel() * t.element_size() for t in tree) - tree.tokens.numel() * INT64 \
        - tree.scores.numel() * FP32
