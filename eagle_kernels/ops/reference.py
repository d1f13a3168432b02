"""Pure-PyTorch reference implementations of every eagle_kernels op family.

These functions are the contract. Triton and CUDA kernels must match them (exactly for
discrete ops, within the per-dtype tolerance for attention), tests and benchmarks compare
against them, and they are the ``"torch"`` backend that runs wherever no kernel is available.
They favour obviously-right code (explicit loops, fp32/fp64 math) over speed, and they assume
valid inputs: argument checking lives once, in the public ops of ``eagle_kernels.ops``.

Tree contract (shared by every op and the runtime; this docstring is where it is defined, the
README gives the overview), for B sequences with one tree of N nodes each:

* ``tokens``    [B, N] int64   node 0 is the root (the last token the target accepted)
* ``parents``   [B, N] int32   ``parents[:, 0] == -1`` and ``0 <= parents[b, i] < i``
* ``depth``     [B, N] int32   root 0; node i sits at position ``prefix_len + depth[b, i]``
* ``scores``    [B, N] float32 cumulative draft log-probability of the path (root 0)
* ``tree_mask`` [B, N, ceil(N/32)] int32, bit ``j % 32`` of word ``j // 32`` in row i is set
  iff node j is node i or one of its ancestors
* ``paths``     [B, N, max_depth+1] int32 root-to-leaf node indices, one row per leaf in
  ascending leaf index, padded with -1 (columns past the leaf's depth, rows past the leaf count)

Acceptance results use ``output_tokens`` [B, max_depth+1] int64 (accepted draft tokens then the
bonus token, padded with -1), ``num_accepted`` [B] int32 (draft tokens accepted, bonus excluded)
and ``accepted_nodes`` [B, max_depth+1] int32 (root then the accepted nodes, padded with -1).

KV caches (target and draft head alike): per layer one K and one V tensor
``[B, max_len, kv_heads, head_dim]`` ("NHD"), contiguous, preallocated, and ``cache_lens`` [B]
int32, each sequence's committed length. A verify pass writes the N tree nodes' K/V at
``[cache_lens[b], cache_lens[b] + N)`` before attending; acceptance then compacts the accepted
path to ``[cache_lens[b], cache_lens[b] + accepted)`` and advances ``cache_lens``.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

MASK_WORD_BITS = 32


class DraftTree(NamedTuple):
    """A batch of draft trees in the tree contract (see the module docstring)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    scores: torch.Tensor
    tree_mask: torch.Tensor
    paths: torch.Tensor


class AcceptResult(NamedTuple):
    """Outcome of one verification step for a batch (see the module docstring)."""

    output_tokens: torch.Tensor
    num_accepted: torch.Tensor
    accepted_nodes: torch.Tensor


# --------------------------------------------------------------------------------------------
# Packed ancestor masks
# --------------------------------------------------------------------------------------------


def mask_words(num_keys: int) -> int:
    """Number of int32 words that hold ``num_keys`` mask bits: ``ceil(num_keys / 32)``."""
    return (num_keys + MASK_WORD_BITS - 1) // MASK_WORD_BITS


def pack_tree_mask(dense: torch.Tensor) -> torch.Tensor:
    """Pack a dense boolean mask into int32 words.

    Parameters
    ----------
    dense : torch.Tensor
        [..., num_keys] bool; ``dense[..., j]`` says whether key j is visible.

    Returns
    -------
    torch.Tensor
        [..., ceil(num_keys / 32)] int32; key j is bit ``j % 32`` of word ``j // 32``. Bits past
        ``num_keys`` are zero. Bit 31 set makes the word negative (two's complement).
    """
    num_keys = dense.shape[-1]
    words = mask_words(num_keys)
    padded = torch.zeros(*dense.shape[:-1], words * MASK_WORD_BITS, dtype=torch.int64,
                         device=dense.device)
    padded[..., :num_keys] = dense.to(torch.int64)
    weights = torch.pow(2, torch.arange(MASK_WORD_BITS, device=dense.device, dtype=torch.int64))
    unsigned = (padded.view(*dense.shape[:-1], words, MASK_WORD_BITS) * weights).sum(-1)
    signed = torch.where(unsigned >= 2**31, unsigned - 2**32, unsigned)
    return signed.to(torch.int32)


def unpack_tree_mask(packed: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Inverse of :func:`pack_tree_mask`: [..., W] int32 words -> [..., num_keys] bool."""
    shifts = torch.arange(MASK_WORD_BITS, device=packed.device, dtype=torch.int64)
    bits = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :num_keys].bool()


# --------------------------------------------------------------------------------------------
# Tree attention
# --------------------------------------------------------------------------------------------


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    sm_scale: float | None = None,
    num_tree_keys: int | None = None,
) -> torch.Tensor:
    """Attention of tree-node queries over a KV prefix plus their tree ancestors.

    Sequence b has ``L = cache_lens[b]`` committed keys at cache positions ``[0, L)`` and
    ``T = num_tree_keys`` tree keys at ``[L, L + T)`` (tree node j at ``L + j``; the caller has
    written them). Query i sees every prefix key and tree key j iff bit j of
    ``tree_mask[b, i]`` is set. Query heads share KV heads in groups (GQA): query head h reads
    KV head ``h // (Hq // Hkv)``. Math is done in fp32; a query that sees no key gets zeros.

    Parameters
    ----------
    q : torch.Tensor
        [B, Nq, Hq, D] float16 / bfloat16 / float32 queries of the tree nodes.
    k_cache, v_cache : torch.Tensor
        [B, max_len, Hkv, D] ("NHD"), same dtype as ``q``; ``Hq % Hkv == 0``.
    cache_lens : torch.Tensor
        [B] int32 committed prefix lengths; ``cache_lens[b] + T <= max_len``.
    tree_mask : torch.Tensor
        [B, Nq, ceil(T / 32)] int32 packed visibility of the tree keys.
    sm_scale : float, optional
        Softmax scale, default ``D ** -0.5``.
    num_tree_keys : int, optional
        T, default Nq (the verify pass: every tree node is both query and key). Drafting
        passes a frontier of Nq queries over T >= Nq drafted keys.

    Returns
    -------
    torch.Tensor
        [B, Nq, Hq, D], dtype of ``q``.
    """
    batch, num_queries, q_heads, head_dim = q.shape
    group = q_heads // k_cache.shape[2]
    tree_keys = num_queries if num_tree_keys is None else num_tree_keys
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    tree_visible = unpack_tree_mask(tree_mask, tree_keys)
    out = torch.zeros_like(q)
    for b in range(batch):
        prefix = int(cache_lens[b])
        keys = k_cache[b, : prefix + tree_keys].float().repeat_interleave(group, dim=1)
        values = v_cache[b, : prefix + tree_keys].float().repeat_interleave(group, dim=1)
        logits = torch.einsum("qhd,khd->hqk", q[b].float(), keys) * scale
        prefix_visible = torch.ones(num_queries, prefix, dtype=torch.bool, device=q.device)
        visible = torch.cat([prefix_visible, tree_visible[b]], dim=1)
        logits = logits.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # rows with no visible key
        out[b] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    return out


# --------------------------------------------------------------------------------------------
# Top-k over the vocabulary, EAGLE-2 expansion and rerank
# --------------------------------------------------------------------------------------------


def _topk_lowest_index_first(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim, descending; equal values ordered by lowest index first.

    Definition: a stable descending sort, cut after k. Computed without sorting the whole row
    (the runtime's CPU path calls this on vocabulary rows every drafting step): the k-th
    largest value from torch.topk, every value above it, then the lowest-index ties at it,
    then a stable sort of just those k. NaN rows fall back to the full sort.
    """
    if k == 0 or bool(torch.isnan(values).any()):
        sorted_values, order = torch.sort(values, dim=-1, descending=True, stable=True)
        return sorted_values[..., :k].contiguous(), order[..., :k].contiguous()
    kth = torch.topk(values, k, dim=-1).values[..., -1:]
    above, tied = values > kth, values == kth
    room = k - above.sum(-1, keepdim=True)
    keep = above | (tied & (torch.cumsum(tied, dim=-1) <= room))
    index = torch.nonzero(keep)[:, -1].view(*values.shape[:-1], k)  # ascending per row
    kept = values.gather(-1, index)
    order = torch.sort(kept, dim=-1, descending=True, stable=True).indices
    return kept.gather(-1, order), index.gather(-1, order)


def topk_log_softmax(
    logits: torch.Tensor, k: int, d2t: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused log-softmax + top-k over vocabulary rows.

    Parameters
    ----------
    logits : torch.Tensor
        [R, V] float16 / bfloat16 / float32; ``-inf`` marks impossible tokens.
    k : int
        Number of candidates per row, ``1 <= k <= V``.
    d2t : torch.Tensor, optional
        [V] int64 EAGLE-3 draft-to-target offsets: draft id ``i`` is target id ``i + d2t[i]``.

    Returns
    -------
    log_probs : torch.Tensor
        [R, k] float32 log-softmax values (computed in fp32) of the k largest logits, in
        descending logit order, equal logits by lowest id. Ranking by the logits themselves
        (not by the rounded log-probs, which can merge two different logits into one value)
        makes the order exact and reproducible by any kernel; log-softmax rounding is
        monotone, so the values are non-increasing too.
    token_ids : torch.Tensor
        [R, k] int64 vocabulary ids (target ids when ``d2t`` is given).
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    _, ids = _topk_lowest_index_first(logits.float(), k)
    values = log_probs.gather(-1, ids)
    if d2t is not None:
        ids = ids + d2t[ids]
    return values, ids


def eagle2_expand(
    frontier_scores: torch.Tensor, child_log_probs: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One EAGLE-2 expansion step for a batch of independent trees.

    Parameters
    ----------
    frontier_scores : torch.Tensor
        [B, K] float32 cumulative log-probabilities of the K frontier nodes.
    child_log_probs : torch.Tensor
        [B, K, C] float32 log-probabilities of each frontier node's C best children (the output
        of :func:`topk_log_softmax`, so each row is descending).
    top_k : int
        Size of the next frontier, ``1 <= top_k <= K * C``.

    Returns
    -------
    candidate_scores : torch.Tensor
        [B, K * C] float32 ``frontier_scores[b, f] + child_log_probs[b, f, c]`` at ``f * C + c``.
    next_index : torch.Tensor
        [B, top_k] int64 flat candidate indices of the next frontier, best first, ties by lowest
        index. The parent's frontier slot is ``next_index // C``, the child slot ``% C``.
    next_scores : torch.Tensor
        [B, top_k] float32 their cumulative scores.
    """
    batch = frontier_scores.shape[0]
    candidate_scores = (frontier_scores.unsqueeze(-1) + child_log_probs).reshape(batch, -1)
    next_scores, next_index = _topk_lowest_index_first(candidate_scores, top_k)
    return candidate_scores, next_index, next_scores


def eagle2_rerank(
    root_tokens: torch.Tensor,
    candidate_tokens: torch.Tensor,
    candidate_scores: torch.Tensor,
    candidate_parents: torch.Tensor,
    num_nodes: int,
    max_depth: int | None = None,
) -> tuple[DraftTree, torch.Tensor]:
    """Keep the best ``num_nodes - 1`` draft candidates and build the tree from them.

    Candidates are every node drafted this cycle, numbered in the order they were drafted (a
    parent always before its children). Selection is by score, best first, ties by lowest
    candidate index; the kept candidates are then re-ordered by candidate index, which is a
    topological order. Because a child's score never exceeds its parent's and ties prefer the
    lower (parent) index, every kept candidate's parent is kept too.

    Parameters
    ----------
    root_tokens : torch.Tensor
        [B] int64, the root (last accepted) token of each tree.
    candidate_tokens : torch.Tensor
        [B, M] int64 drafted tokens.
    candidate_scores : torch.Tensor
        [B, M] float32 cumulative log-probabilities (non-increasing from parent to child).
    candidate_parents : torch.Tensor
        [B, M] int32 parent candidate index (``< own index``), or -1 for a child of the root.
    num_nodes : int
        N, tree size including the root, ``1 <= N <= M + 1``.
    max_depth : int, optional
        Width of ``paths`` minus one (default N - 1); must be >= the deepest kept node.

    Returns
    -------
    tree : DraftTree
        The N-node trees (root score 0).
    selected : torch.Tensor
        [B, N - 1] int64 candidate index of tree nodes 1..N-1.
    """
    batch = candidate_tokens.shape[0]
    _, best = _topk_lowest_index_first(candidate_scores, num_nodes - 1)
    selected = torch.sort(best, dim=-1).values
    node_of_candidate = torch.full_like(candidate_tokens, -1)
    node_ids = torch.arange(1, num_nodes, device=selected.device).expand(batch, -1)
    node_of_candidate.scatter_(1, selected, node_ids)
    parent_candidate = candidate_parents.to(torch.int64).gather(1, selected)
    parent_node = node_of_candidate.gather(1, parent_candidate.clamp(min=0))
    parent_node = torch.where(parent_candidate < 0, 0, parent_node)
    if bool((parent_node < 0).any()):
        raise ValueError(
            "candidate_scores: a kept candidate's parent was not kept; scores must not increase "
            "from parent to child"
        )
    root_column = torch.full((batch, 1), -1, dtype=torch.int64, device=selected.device)
    parents = torch.cat([root_column, parent_node], dim=1).to(torch.int32)
    tokens = torch.cat([root_tokens.view(batch, 1), candidate_tokens.gather(1, selected)], 1)
    root_score = torch.zeros(batch, 1, dtype=torch.float32, device=selected.device)
    scores = torch.cat([root_score, candidate_scores.float().gather(1, selected)], dim=1)
    depth, tree_mask, paths = build_tree(parents, max_depth)
    return DraftTree(tokens, parents, depth, scores, tree_mask, paths), selected


# --------------------------------------------------------------------------------------------
# Tree construction
# --------------------------------------------------------------------------------------------


def build_tree(
    parents: torch.Tensor, max_depth: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Depth, packed ancestor mask and root-to-leaf paths of topologically ordered trees.

    Parameters
    ----------
    parents : torch.Tensor
        [B, N] int32, ``parents[:, 0] == -1`` and ``0 <= parents[b, i] < i`` for i >= 1.
    max_depth : int, optional
        D, default N - 1. Must be >= the depth of every node.

    Returns
    -------
    depth : torch.Tensor
        [B, N] int32, root 0.
    tree_mask : torch.Tensor
        [B, N, ceil(N / 32)] int32, row i has the bits of i and its ancestors.
    paths : torch.Tensor
        [B, N, D + 1] int32; row r is the path root -> r-th leaf (leaves in ascending node index),
        padded with -1; rows past the number of leaves are all -1.
    """
    batch, num_nodes = parents.shape
    width = (num_nodes - 1 if max_depth is None else max_depth) + 1
    parent_index = parents.to(torch.int64)
    ancestors = torch.zeros(batch, num_nodes, num_nodes, dtype=torch.bool, device=parents.device)
    ancestors[:, 0, 0] = True
    rows = torch.arange(batch, device=parents.device)
    for node in range(1, num_nodes):
        ancestors[:, node] = ancestors[rows, parent_index[:, node]]
        ancestors[:, node, node] = True
    depth = ancestors.sum(-1).to(torch.int32) - 1
    if num_nodes > 1 and batch and int(depth.max()) >= width:
        raise ValueError(f"max_depth: expected >= the tree depth {int(depth.max())}, "
                         f"got {width - 1}")

    has_child = torch.zeros(batch, num_nodes, dtype=torch.bool, device=parents.device)
    has_child.scatter_(1, parent_index[:, 1:].clamp(min=0), True)
    paths = torch.full((batch, num_nodes, width), -1, dtype=torch.int32, device=parents.device)
    for b in range(batch):
        leaves = torch.nonzero(~has_child[b]).flatten()
        for row, leaf in enumerate(leaves.tolist()):
            # A node's ancestors have smaller indices, so ascending index is root-to-leaf order.
            path = torch.nonzero(ancestors[b, leaf]).flatten()
            paths[b, row, : path.numel()] = path.to(torch.int32)
    return depth, pack_tree_mask(ancestors), paths


# --------------------------------------------------------------------------------------------
# Target sampling distribution
# --------------------------------------------------------------------------------------------


def _per_row(value, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Broadcast a Python scalar or a [rows] tensor of sampling parameters to [rows]."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).expand(rows)
    return torch.full((rows,), value, dtype=dtype, device=device)


def target_probs(
    logits: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """The target's sampling distribution: temperature, then top-k, then top-p.

    * temperature: ``softmax(logits / temperature)``, temperature > 0.
    * top-k (0 disables): keep tokens whose logit is >= the k-th largest (ties kept).
    * top-p (1.0 disables), on the top-k-renormalised distribution: keep token x iff the total
      probability of tokens strictly more probable than x is < top_p (ties kept; the most
      probable token is always kept). No full-vocabulary order is implied, so sort-free
      kernels can match it.

    Parameters
    ----------
    logits : torch.Tensor
        [R, V] float16 / bfloat16 / float32.
    temperature, top_k, top_p : scalar or torch.Tensor
        A Python scalar for all rows or a [R] tensor (float32 / int / float32).

    Returns
    -------
    torch.Tensor
        [R, V] float32 probabilities, zero outside the kept set, rows summing to 1.
    """
    rows, vocab = logits.shape
    device = logits.device
    # Python scalars (the runtime's SamplingConfig) say on the host, with no device read, when
    # a filter keeps every token or only a few: the full-vocabulary sorts are then skipped or
    # replaced by topk, with the same numbers (a sampling step on CPU spent 13 ms in them).
    k_scalar = None if isinstance(top_k, torch.Tensor) else int(top_k)
    p_scalar = not isinstance(top_p, torch.Tensor)
    p_off = p_scalar and top_p >= 1
    temperature = _per_row(temperature, rows, torch.float32, device)
    top_k = _per_row(top_k, rows, torch.int64, device)
    top_p = _per_row(top_p, rows, torch.float64, device)
    scaled = logits.float() / temperature.unsqueeze(1)

    if k_scalar is not None and k_scalar <= 0:
        keep_k = torch.ones_like(scaled, dtype=torch.bool)
    else:
        if k_scalar is not None:  # the k largest (ties counted) as a descending sort has them
            kth = torch.topk(scaled, min(k_scalar, vocab), dim=-1).values[:, -1:]
        else:
            sorted_logits = torch.sort(scaled, dim=-1, descending=True).values
            kth = sorted_logits.gather(1, (top_k.clamp(1, vocab) - 1).unsqueeze(1))
        keep_k = (scaled >= kth) | (top_k <= 0).unsqueeze(1)
    probs = torch.softmax(scaled.masked_fill(~keep_k, float("-inf")), dim=-1).double()
    if p_off:
        return (probs / probs.sum(-1, keepdim=True)).float()
    if p_scalar and probs.device.type == "cpu":
        keep_p = _top_p_among_the_largest(probs, top_p)
    else:
        keep_p = _top_p_keep(torch.sort(probs, dim=-1, descending=True).values, probs, top_p)
    probs = probs * keep_p
    return (probs / probs.sum(-1, keepdim=True)).float()


def _top_p_keep(largest: torch.Tensor, probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-p's keep mask [R, V] from ``largest`` [R, m], each row's m largest ``probs`` in
    descending order (m = V: the whole sort). Only tokens at least the m-th largest are
    decided here; :func:`_top_p_among_the_largest` says when the others are all dropped."""
    m = largest.shape[1]
    mass_before = torch.cumsum(largest, dim=-1) - largest  # exclusive prefix sums
    ascending = torch.flip(largest, dims=[-1]).contiguous()
    count_greater = m - torch.searchsorted(ascending, probs, right=True)
    mass_greater = mass_before.gather(1, count_greater.clamp(max=m - 1))
    # top_p >= 1 disables top-p exactly: summed fp32 probabilities can fall a hair short of 1,
    # which would otherwise drop tokens far in the tail.
    keep = (mass_greater < top_p.unsqueeze(1)) | (top_p >= 1).unsqueeze(1)
    return keep if m == probs.shape[1] else keep & (probs >= largest[:, -1:])


TOP_P_FIRST_CANDIDATES = 64  # top-p's kept set is looked for among this many tokens, then x4


def _top_p_among_the_largest(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The keep mask of :func:`_top_p_keep` over the full sort, from the m largest only, m
    growing until their mass reaches top_p (with a margin far above double rounding): every
    smaller token then has at least that mass before it and is dropped, and the larger ones
    see the same prefix sums (CPU cumsum adds in order, so a prefix of the sort sums alike)."""
    vocab = probs.shape[1]
    m = min(TOP_P_FIRST_CANDIDATES, vocab)
    while True:
        largest = torch.topk(probs, m, dim=-1).values
        if m == vocab or bool((largest.sum(-1) >= top_p + 1e-9).all()):
            return _top_p_keep(largest, probs, top_p)
        m = min(4 * m, vocab)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds ``u * total``.

    Parameters
    ----------
    probs : torch.Tensor
        [R, V] float32, non-negative, each row with positive total (need not be normalised).
    uniforms : torch.Tensor
        [R] float32 in [0, 1).

    Returns
    -------
    torch.Tensor
        [R] int64. Never a zero-probability token: the strict comparison skips flat CDF steps,
        and float round-off past the end falls back to the last positive-probability token.
    """
    cdf = torch.cumsum(probs.double(), dim=-1)
    threshold = uniforms.double().unsqueeze(1) * cdf[:, -1:]
    index = (cdf <= threshold).sum(-1)
    last_positive = probs.shape[1] - 1 - torch.argmax((probs.flip(-1) > 0).int(), dim=-1)
    return torch.minimum(index, last_positive)


# --------------------------------------------------------------------------------------------
# Acceptance
# --------------------------------------------------------------------------------------------


def greedy_accept_tree(
    tokens: torch.Tensor, paths: torch.Tensor, target_logits: torch.Tensor
) -> AcceptResult:
    """Greedy verification of draft trees: the longest path the target's argmax agrees with.

    Node ``paths[b, r, j + 1]`` is accepted when its token equals the target's argmax at node
    ``paths[b, r, j]`` (argmax ties: lowest token id) and every earlier node on the path was
    accepted. The path with the most accepted nodes wins (ties: lowest row); the bonus token is
    the argmax at its last accepted node.

    Parameters
    ----------
    tokens : torch.Tensor
        [B, N] int64 tree tokens.
    paths : torch.Tensor
        [B, P, D + 1] int32 root-to-leaf paths padded with -1 (from :func:`build_tree`).
    target_logits : torch.Tensor
        [B, N, V] float16 / bfloat16 / float32, the target's logits at every node.

    Returns
    -------
    AcceptResult
        Widths D + 1.
    """
    target_ids = torch.argmax(target_logits, dim=-1)
    safe_paths = paths.to(torch.int64).clamp(min=0).flatten(1)
    path_tokens = tokens.gather(1, safe_paths).view(paths.shape)
    predicted = target_ids.gather(1, safe_paths).view(paths.shape)
    match = (path_tokens[:, :, 1:] == predicted[:, :, :-1]) & (paths[:, :, 1:] >= 0)
    accepted_len = torch.cumprod(match.to(torch.int64), dim=-1).sum(-1)
    accepted_len = torch.where(paths[:, :, 0] >= 0, accepted_len, -1)
    best = torch.argmax(accepted_len, dim=-1)  # first maximum: lowest row wins ties

    batch, _, width = paths.shape
    rows = torch.arange(batch, device=tokens.device)
    num_accepted = accepted_len[rows, best]
    best_path = paths[rows, best].to(torch.int64)
    position = torch.arange(width, device=tokens.device).unsqueeze(0)
    accepted_nodes = torch.where(position <= num_accepted.unsqueeze(1), best_path, -1)
    output_tokens = torch.full((batch, width), -1, dtype=torch.int64, device=tokens.device)
    draft_part = tokens.gather(1, best_path[:, 1:].clamp(min=0))
    output_tokens[:, :-1] = torch.where(position[:, 1:] <= num_accepted.unsqueeze(1),
                                        draft_part, -1)
    last_node = best_path.gather(1, num_accepted.unsqueeze(1))
    bonus = target_ids.gather(1, last_node)
    output_tokens.scatter_(1, num_accepted.unsqueeze(1), bonus)
    return AcceptResult(output_tokens, num_accepted.to(torch.int32),
                        accepted_nodes.to(torch.int32))


def chain_paths(batch: int, num_nodes: int, device: torch.device) -> torch.Tensor:
    """Paths of chain-shaped trees (node i's parent is i - 1): [B, 1, N] int32 of 0..N-1."""
    return torch.arange(num_nodes, dtype=torch.int32, device=device).expand(batch, 1, -1)


def greedy_accept_chain(tokens: torch.Tensor, target_logits: torch.Tensor) -> AcceptResult:
    """Greedy verification of draft chains: tokens [B, N] (node 0 the root), logits [B, N, V].

    Same result as :func:`greedy_accept_tree` on a chain; widths N.
    """
    batch, num_nodes = tokens.shape
    return greedy_accept_tree(tokens, chain_paths(batch, num_nodes, tokens.device), target_logits)


def _empty_result(batch: int, width: int, device: torch.device) -> AcceptResult:
    return AcceptResult(
        torch.full((batch, width), -1, dtype=torch.int64, device=device),
        torch.zeros(batch, dtype=torch.int32, device=device),
        torch.full((batch, width), -1, dtype=torch.int32, device=device),
    )


def stochastic_accept_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    target_logits: torch.Tensor,
    accept_uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
    max_depth: int | None = None,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
) -> AcceptResult:
    """Lossless rejection sampling over trees of deterministic top-k draft candidates.

    Starting at the root with ``p`` = the target distribution there (:func:`target_probs`), the
    children of the current node are tried in ascending node index (for EAGLE-2 trees: best
    draft score first). Child x is accepted iff ``accept_uniforms[b, x] < p[token(x)]``; then
    the walk moves to x with p = the target distribution at x. On rejection ``p[token(x)]`` is
    set to zero and p renormalised before the next sibling. When no child is accepted, the
    bonus token is drawn from the current p by :func:`sample_from_probs` with
    ``bonus_uniforms[b]``. The emitted tokens are distributed exactly as sampling the target.

    Parameters
    ----------
    tokens, parents : torch.Tensor
        [B, N] int64 / int32 tree tokens and parents.
    target_logits : torch.Tensor
        [B, N, V] float16 / bfloat16 / float32.
    accept_uniforms : torch.Tensor
        [B, N] float32 in [0, 1); column i is used when node i is tried (column 0 is unused).
    bonus_uniforms : torch.Tensor
        [B] float32 in [0, 1).
    max_depth : int, optional
        Output width minus one, default N - 1; must be >= the tree depth.
    temperature, top_k, top_p : scalar or [B] tensor
        Target sampling parameters (temperature > 0), see :func:`target_probs`.

    Returns
    -------
    AcceptResult
        Widths ``max_depth + 1``.
    """
    batch, num_nodes, vocab = target_logits.shape
    width = (num_nodes - 1 if max_depth is None else max_depth) + 1
    probs = _node_probs(target_logits, temperature, top_k, top_p)
    result = _empty_result(batch, width, tokens.device)
    for b in range(batch):
        children = [[] for _ in range(num_nodes)]
        for node in range(1, num_nodes):
            children[int(parents[b, node])].append(node)
        node, accepted, residual = 0, 0, probs[b, 0].clone()
        result.accepted_nodes[b, 0] = 0
        while True:
            for child in children[node]:
                token = int(tokens[b, child])
                if float(accept_uniforms[b, child]) < float(residual[token]):
                    break
                residual[token] = 0.0
                residual = residual / residual.sum()
            else:
                break
            result.output_tokens[b, accepted] = token
            accepted += 1
            result.accepted_nodes[b, accepted] = child
            node, residual = child, probs[b, child].clone()
        bonus = sample_from_probs(residual[None], bonus_uniforms[b:b + 1])
        result.output_tokens[b, accepted] = bonus[0]
        result.num_accepted[b] = accepted
    return result


def stochastic_accept_chain(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_logits: torch.Tensor,
    accept_uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
) -> AcceptResult:
    """Lossless speculative sampling of draft chains sampled from known draft distributions.

    Node i (i >= 1) holds a token x drawn from ``q = draft_probs[b, i - 1]``; with
    ``p`` = the target distribution at node i - 1 it is accepted iff
    ``accept_uniforms[b, i] * q[x] < p[x]`` (probability ``min(1, p[x] / q[x])``). At the first
    rejection the bonus token is drawn from ``norm(max(0, p - q))``; if every node is accepted,
    from the target distribution at the last node. Sampling uses ``bonus_uniforms[b]`` and
    :func:`sample_from_probs`.

    Parameters
    ----------
    tokens : torch.Tensor
        [B, N] int64, node 0 the root, node i the child of node i - 1.
    draft_probs : torch.Tensor
        [B, N - 1, V] float32, the distribution each draft token was sampled from.
    target_logits : torch.Tensor
        [B, N, V] float16 / bfloat16 / float32.
    accept_uniforms : torch.Tensor
        [B, N] float32 in [0, 1), column i for node i (column 0 unused).
    bonus_uniforms : torch.Tensor
        [B] float32 in [0, 1).
    temperature, top_k, top_p : scalar or [B] tensor
        Target sampling parameters, see :func:`target_probs`.

    Returns
    -------
    AcceptResult
        Widths N.
    """
    batch, num_nodes, vocab = target_logits.shape
    probs = _node_probs(target_logits, temperature, top_k, top_p)
    result = _empty_result(batch, num_nodes, tokens.device)
    for b in range(batch):
        result.accepted_nodes[b, 0] = 0
        accepted, bonus_dist = 0, probs[b, num_nodes - 1]
        for node in range(1, num_nodes):
            token = int(tokens[b, node])
            p, q = probs[b, node - 1], draft_probs[b, node - 1].float()
            if float(accept_uniforms[b, node]) * float(q[token]) < float(p[token]):
                result.output_tokens[b, accepted] = token
                accepted += 1
                result.accepted_nodes[b, accepted] = node
                continue
            residual = (p - q).clamp(min=0.0)
            bonus_dist = residual if float(residual.sum()) > 0 else p
            break
        bonus = sample_from_probs(bonus_dist[None], bonus_uniforms[b:b + 1])
        result.output_tokens[b, accepted] = bonus[0]
        result.num_accepted[b] = accepted
    return result


def _node_probs(target_logits, temperature, top_k, top_p) -> torch.Tensor:
    """target_probs for every node, per-sequence parameters repeated over the N nodes."""
    batch, num_nodes, vocab = target_logits.shape

    def per_node(value):
        return value.repeat_interleave(num_nodes) if isinstance(value, torch.Tensor) else value

    flat = target_probs(target_logits.reshape(batch * num_nodes, vocab), per_node(temperature),
                        per_node(top_k), per_node(top_p))
    return flat.view(batch, num_nodes, vocab)


# --------------------------------------------------------------------------------------------
# KV compaction
# --------------------------------------------------------------------------------------------


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             cache_lens: torch.Tensor, offset: int = 0) -> None:
    """Store new keys and values in the cache, in place: row ``cache_lens[b] + offset + t`` of
    sequence b gets ``k[b, t]`` / ``v[b, t]``.

    Parameters
    ----------
    k, v : torch.Tensor
        [B, T, H, D], the caches' dtype.
    k_cache, v_cache : torch.Tensor
        [B, max_len, H, D]; ``cache_lens[b] + offset + T <= max_len``.
    cache_lens : torch.Tensor
        [B] int32 committed lengths.
    offset : int
        Rows already written past the committed length (tree keys drafted earlier).
    """
    batch, count = k.shape[:2]
    rows = torch.arange(batch, device=k.device).unsqueeze(1)
    steps = torch.arange(count, device=k.device).unsqueeze(0)
    positions = cache_lens.to(torch.int64).unsqueeze(1) + offset + steps
    k_cache[rows, positions] = k
    v_cache[rows, positions] = v


def rope_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, cache_lens: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """An attention layer's prologue: :func:`apply_rope` of ``q`` and ``k``, :func:`write_kv`
    of the rotated ``k`` and ``v``; returns the rotated ``q``."""
    write_kv(apply_rope(k, positions, cos, sin), v, k_cache, v_cache, cache_lens, offset)
    return apply_rope(q, positions, cos, sin)


def compact_kv(
    caches: Sequence[torch.Tensor],
    cache_lens: torch.Tensor,
    accepted_nodes: torch.Tensor,
    num_accepted: torch.Tensor,
) -> None:
    """Move the accepted path's K/V entries next to the committed prefix, in place.

    For sequence b with ``L = cache_lens[b]`` and ``n = num_accepted[b] + 1`` (root included),
    entry ``L + accepted_nodes[b, j]`` moves to ``L + j`` for j < n in every cache. Path node
    indices increase along a path, so no entry is overwritten before it is read. The caller then
    advances ``cache_lens`` by n; entries past ``L + n`` are left as they are.

    Parameters
    ----------
    caches : sequence of torch.Tensor
        Every layer's K and V cache, each [B, max_len, H, D] (any dtype, may differ per cache).
    cache_lens : torch.Tensor
        [B] int32 committed lengths before this step.
    accepted_nodes : torch.Tensor
        [B, W] int32 root then accepted node indices, -1 padded (``AcceptResult``).
    num_accepted : torch.Tensor
        [B] int32 draft tokens accepted (``AcceptResult``); ``num_accepted[b] < W``.
    """
    for b in range(cache_lens.shape[0]):
        prefix, count = int(cache_lens[b]), int(num_accepted[b]) + 1
        path = accepted_nodes[b, :count].to(torch.int64)
        # Entries already in place (path[j] == j: the root, a chain of first children) are
        # left alone; when nothing moves (most cycles on CPU), no cache is touched at all.
        moved = torch.nonzero(path != torch.arange(count, device=path.device)).flatten()
        if moved.numel() == 0:
            continue
        source, target = prefix + path[moved], prefix + moved
        for cache in caches:
            cache[b, target] = cache[b, source]  # the gather copies before the scatter writes


# --------------------------------------------------------------------------------------------
# Soft cross-entropy (EAGLE-3 training loss)
# --------------------------------------------------------------------------------------------


def soft_cross_entropy(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Per-row cross-entropy of the draft distribution against the target's, in fp32.

    ``loss[t] = -sum_v softmax(target_logits[t])_v * log_softmax(draft_logits[t])_v``: the
    EAGLE-3 training loss of one position, both logits already restricted to the draft
    vocabulary. Differentiable in ``draft_logits`` (autograd gives
    ``(softmax(x[t]) - softmax(y[t])) * grad_loss[t]`` in x's dtype); the targets are detached.
    Terms whose target probability is exactly 0 contribute 0 (a token masked to -inf in both
    logits gives ``0 * -inf``, which must not turn the row into NaN).

    Parameters
    ----------
    draft_logits : torch.Tensor
        [T, V] float16 / bfloat16 / float32 draft logits x (-inf allowed).
    target_logits : torch.Tensor
        [T, V] float16 / bfloat16 / float32 target logits y (-inf allowed); no gradient.

    Returns
    -------
    torch.Tensor
        [T] float32 loss per row (the caller masks and weights rows).
    """
    log_q = torch.log_softmax(draft_logits.float(), dim=-1)
    p = torch.softmax(target_logits.detach().float(), dim=-1)
    return -(p * log_q.masked_fill(p == 0, 0.0)).sum(-1)


# --------------------------------------------------------------------------------------------
# Decoder-layer ops (linear, RMSNorm, SiLU-gated product, rotary embedding)
# --------------------------------------------------------------------------------------------


def linear_group(
    x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]
) -> tuple[torch.Tensor, ...]:
    """``x @ weights[i].T + biases[i]`` for each i (``torch.nn.functional.linear``).

    x [..., K]; weights[i] [N_i, K]; biases[i] [N_i] or None -> one [..., N_i] per weight.
    """
    return tuple(torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases))


ACTIVATION_BLOCK = 32  # k per activation block (GGUF's Q8_0; csrc/cpu/kernels.h kQ4BlockK)
ACTIVATION_LEVELS = {8: 127, 16: 32767}  # |q| bound per width (csrc/cpu/linear_int8.h)


def quantize_activations(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] fp32 (K a multiple of 32) rounded per block of 32 k to ``bits``-bit integers
    (8: GGUF's Q8_0, as llama.cpp rounds activations; 16): ``s = max|x| / Q`` (fp32, Q = 127
    or 32767), ``q = round(x / s)`` (ties to even; 0 where s = 0, also when a tiny max
    underflows; clamped to [-Q, Q], which only a subnormal s can reach past). A block holding a
    non-finite x gets s = NaN and q = 0. CPU tensors (a CUDA division by a constant may
    multiply by its reciprocal instead).

    Returns (q [..., K] int8 / int16, s [..., K / 32] fp32); ``s q`` is the rounded x.
    """
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // ACTIVATION_BLOCK, ACTIVATION_BLOCK)
    finite = torch.isfinite(blocks).all(-1, keepdim=True)
    amax = blocks.abs().masked_fill(~finite, 0).amax(-1, keepdim=True)
    levels = ACTIVATION_LEVELS[bits]
    scale = amax / levels
    usable = finite & (scale > 0)  # s = 0 also where a tiny max underflows
    q = torch.where(usable, torch.round(blocks / torch.where(usable, scale, 1.0)),
                    0.0).clamp(-levels, levels)  # a subnormal s has too few digits to reach Q
    scale = scale.masked_fill(~finite, float("nan"))
    dtype = torch.int8 if bits == 8 else torch.int16
    return q.to(dtype).reshape(x.shape), scale.squeeze(-1)


def rounded_activations(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """``s q`` of :func:`quantize_activations`, the x a quantized GEMM multiplies: [..., K]
    float64 (exact: an fp32 s times an integer of at most 16 bits)."""
    q, scale = quantize_activations(x, bits)
    return (q.double().reshape(*x.shape[:-1], -1, ACTIVATION_BLOCK)
            * scale.double().unsqueeze(-1)).reshape(x.shape)


def linear_quantized_activations(x: torch.Tensor, weight: torch.Tensor,
                                 bias: torch.Tensor | None = None, bits: int = 8) -> torch.Tensor:
    """``linear`` with x rounded first (:func:`rounded_activations`): the contract of the cpu
    backend's GEMM over Q4 / Q8 block packs with quantized activations on
    (:func:`eagle_kernels.ops.set_cpu_activations`). Computed in float64, rounded once to x's
    dtype (float64 x holding fp32 values gives the unrounded product); the kernel is within a
    proven bound of it (csrc/cpu/linear_int8.h).

    x [..., K] fp32 values (K a multiple of 32); weight [N, K]; bias [N] or None -> [..., N],
    dtype of x.
    """
    y = rounded_activations(x, bits) @ weight.double().T
    return (y if bias is None else y + bias.double()).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """transformers' LlamaRMSNorm: ``weight * (h * rsqrt(mean(h^2) + eps))`` in fp32, cast back
    to ``x``'s dtype before the weight; ``h = x (+ residual)``, returned too when given."""
    h = x if residual is None else x + residual
    dtype = h.dtype
    hf = h.float()
    normed = weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return normed if residual is None else (normed, h)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, the gated MLP's activation."""
    return torch.nn.functional.silu(gate) * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[..., D] -> concat(-x[..., D/2:], x[..., :D/2])."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: ``x * cos[p] + rotate_half(x) * sin[p]``.

    x [B, T, H, D]; positions [B, T] int64 in [0, P); cos, sin [P, D] tables.
    """
    c = cos[positions].unsqueeze(2)
    s = sin[positions].unsqueeze(2)
    return x * c + rotate_half(x) * s


def decoder_layer(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    input_norm: torch.Tensor | None,
    post_norm: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    tree_offset: int = 0,
    residual: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """One pre-norm decoder layer (Llama / Qwen2 / Mistral, SiLU-gated MLP) over the KV cache.

    x [B, T, in]; weights q, k, v, o, gate, up, down in nn.Linear's [N, K] layout, biases the
    same order (None: no bias); input_norm [in] or None (no input norm: EAGLE heads); post_norm
    [H]; positions [B, T] int64 into the cos / sin tables [P, D]; caches [B, max_len, Hkv, D]
    (the T new keys are written at ``cache_lens[b] + tree_offset + t``, in place); tree_mask
    [B, T, ceil((tree_offset + T) / 32)] over the ``tree_offset + T`` tree keys; residual [B, T,
    H] (default x). Returns ``h + down(silu(gate(n)) * up(n))`` [B, T, H] with ``h = residual +
    o_proj(attention)`` and ``n = post_norm(h)``.
    """
    batch, count, _ = x.shape
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    q_heads = weights[0].shape[0] // head_dim
    residual = x if residual is None else residual
    normed = x if input_norm is None else rms_norm(x, input_norm, eps)
    q, k, v = linear_group(normed, weights[:3], biases[:3])
    q = apply_rope(q.view(batch, count, q_heads, head_dim), positions, cos, sin)
    k = apply_rope(k.view(batch, count, kv_heads, head_dim), positions, cos, sin)
    rows = torch.arange(batch, device=x.device).unsqueeze(1)
    slots = (cache_lens.to(torch.int64).unsqueeze(1) + tree_offset
             + torch.arange(count, device=x.device))
    k_cache[rows, slots] = k
    v_cache[rows, slots] = v.view(batch, count, kv_heads, head_dim)
    attended = tree_attention(q.contiguous(), k_cache, v_cache, cache_lens, tree_mask, sm_scale,
                              tree_offset + count)
    o = linear_group(attended.reshape(batch, count, q_heads * head_dim), weights[3:4],
                     biases[3:4])[0]
    normed, h = rms_norm(o, post_norm, eps, residual=residual)
    gate, up = linear_group(normed, weights[4:6], biases[4:6])
    return h + linear_group(silu_mul(gate, up), weights[6:7], biases[6:7])[0]
