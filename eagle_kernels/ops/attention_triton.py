"""Triton backend of :func:`eagle_kernels.ops.tree_attention` (contract: the reference op).

Kernel design and GQA row stacking: :mod:`eagle_kernels.ops.attention`.

Row invariance. Greedy speculative decoding is lossless by construction only if a tree node's
output is bit for bit a decode step's at its position. The Triton kernels give that for every
tree of up to ORDERED_MAX_TREE_KEYS keys: one tile shape per pass for every call, each row's
keys visited in list order (prefix, then its ancestors) in blocks and splits at fixed list
positions (splits from the cache capacity only, :func:`split_keys_for`), splits merged in order.
They run in two passes. The first folds every split's shared blocks (whole blocks of prefix
keys, the same for every row: no mask, no per-node work) for all row tiles, several splits per
program where the splits outnumber the SMs' room (:func:`splits_per_program`). The second, one
query node per program, continues the node's rows from the last, partial prefix block through
its ancestors (gathered in list order), then merges their splits and writes their output. The
fp32 state crosses between the passes through the workspace exactly, so the arithmetic is that
of one pass. (One pass doing both, the per-node prologue in every split's program, ran 3.4-7.2x
causal attention on an H200: bench/results/2026-11-27_nvidia-h200.)

Calls of more tree keys (prefill chains, big trees) take one slot-order pass instead: the tree
keys in blocks of their own after the prefix, FA2-like tiles, splits by occupancy.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ._backend import register
from ._triton import tl, triton
from .attention import (MAX_SPLITS, MIN_SPLIT_KEYS, _raise_unsupported, _sm_count, _workspace,
                        choose_num_splits)


TRITON_BLOCK_M = 16  # rows per tile of every ordered call: one tile shape whatever N is
ORDERED_MAX_TREE_KEYS = 256  # trees up to this many keys reduce in position order (below)
# No multiply-add contraction on the GPU (the interpreter has none): the shared-prefix loop and
# the per-node loop fold the same block for a decode step and a tree node, and ptxas could
# contract their multiplies and adds differently (fma rounds once, mul + add twice).
EXACT_ROUNDING = {"enable_fp_fusion": False}
LOG2_E = math.log2(math.e)  # exp(x) = exp2(x log2 e): the kernels' logits are base 2


@triton.jit
def _mma(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` with fp32 accumulation. UPCAST (bf16 under the interpreter only, whose dot
    multiplies bf16's raw uint16 storage as integers) widens the operands first: bf16 x bf16
    products are exact in fp32, so the numbers are those of the bf16 MMA (up to summation
    order)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _cast(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 -> ``dtype`` rounding to nearest even. With UPCAST (bf16 under the interpreter,
    whose fp32 -> bf16 cast truncates) the rounding is done on the bits first, so the cast
    that follows is exact and the interpreter rounds as the GPU does."""
    if UPCAST:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


def interpreter_upcast(t: torch.Tensor) -> bool:
    """UPCAST of :func:`_mma` / :func:`_cast` for kernels over ``t``: bf16 CPU tensors, which
    only the interpreter runs."""
    return t.dtype == torch.bfloat16 and t.device.type == "cpu"


def dot_precision(t: torch.Tensor) -> str:
    """DOT_PRECISION of :func:`_mma` for ``t``'s dtype: exact fp32 products for fp32 inputs
    (fp16 / bf16 products are exact anyway)."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


@triton.jit
def _online_softmax_step(s, v, m_i, l_i, acc, DOT_PRECISION: tl.constexpr,
                         UPCAST: tl.constexpr):
    """Fold one block of base-2 logits ``s`` [BM, BN] (``-inf`` where masked) and its values
    ``v`` [BN, BD] into the running max ``m_i``, sum ``l_i`` and unnormalised output ``acc``."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row with no visible key so far keeps m = -inf: subtract 0 instead (exp2(-inf) = 0)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _mma(_cast(p, v.dtype, UPCAST), v, DOT_PRECISION, UPCAST)
    return m_new, l_i, acc


@triton.jit
def _key_block(q, k_seq, v_seq, rows_of, cols, cols_ok, dims, dim_ok, stride_kn, scale_log2,
               m_i, l_i, acc, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One key block: K / V cache rows ``rows_of`` [BN] (read where ``cols_ok``), logits
    masked to ``cols`` [BM, BN], folded into the state of every row."""
    kv_mask = cols_ok[:, None] & dim_ok[None, :]
    offsets = rows_of[:, None].to(tl.int64) * stride_kn + dims[None, :]
    k = tl.load(k_seq + offsets, mask=kv_mask, other=0.0)
    v = tl.load(v_seq + offsets, mask=kv_mask, other=0.0)
    s = _mma(q, tl.trans(k), DOT_PRECISION, UPCAST) * scale_log2
    s = tl.where(cols, s, float("-inf"))
    return _online_softmax_step(s, v, m_i, l_i, acc, DOT_PRECISION, UPCAST)


@triton.jit
def _prefix_splits_kernel(
        q_ptr, k_ptr, v_ptr, lens_ptr, part_o_ptr, part_ml_ptr,
        num_queries, q_heads, tree_keys, num_splits, split_keys, max_len,
        scale_log2, stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
        UPCAST: tl.constexpr):
    """Ordered pass 1, program (row tile x KV head, sequence b, p of P): the shared blocks of
    splits p, p + P, p + 2P, ... (strided: a short prefix in a big cache leaves the high splits
    empty), i.e. their list positions below ``shared_end = L // BLOCK_N * BLOCK_N`` (prefix keys
    that every row of the tile sees, in whole blocks), each folded into a fresh state and stored
    to the workspace, empty splits too (m = -inf, l = 0). How many splits a program runs changes
    no arithmetic: each starts from a fresh state."""
    row_tiles = tl.cdiv(num_queries * GROUP, BLOCK_M)
    kv_head = tl.program_id(0) // row_tiles  # neighbouring programs share a KV head (L2 reuse)
    tile = tl.program_id(0) % row_tiles
    b = tl.program_id(1)

    row_ok, query, head, dims, dim_ok, q = _tile_rows(
        q_ptr, b, tile, kv_head, num_queries, stride_qb, stride_qn, stride_qh, GROUP, HEAD_DIM,
        BLOCK_D, BLOCK_M)
    shared_end = _clamped_prefix(lens_ptr, b, max_len, tree_keys) // BLOCK_N * BLOCK_N
    k_seq = k_ptr + b.to(tl.int64) * stride_kb + kv_head * stride_kh
    v_seq = v_ptr + b.to(tl.int64) * stride_kb + kv_head * stride_kh
    keys = tl.arange(0, BLOCK_N)
    every_row = tl.full([BLOCK_M], 1, tl.int1)
    for split in range(tl.program_id(2), num_splits, tl.num_programs(2)):
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        end = tl.minimum(split * split_keys + split_keys, shared_end)
        for block in range(split * split_keys, end, BLOCK_N):
            pos = block + keys
            key_ok = pos < end
            m_i, l_i, acc = _key_block(q, k_seq, v_seq, pos, every_row[:, None] & key_ok[None, :],
                                       key_ok, dims, dim_ok, stride_kn, scale_log2, m_i, l_i,
                                       acc, DOT_PRECISION, UPCAST)
        part = _part_rows(b, split, num_splits, num_queries, q_heads, query, head)
        _store_state(part_o_ptr, part_ml_ptr, part, row_ok, dims, dim_ok, HEAD_DIM, m_i, l_i,
                     acc)


@triton.jit
def _tree_tail_kernel(
        q_ptr, k_ptr, v_ptr, lens_ptr, mask_ptr, out_ptr, part_o_ptr, part_ml_ptr, slots_ptr,
        num_queries, q_heads, tree_keys, words, num_splits, split_keys, max_len, scale_log2,
        stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
        NODE_SLOTS: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Ordered pass 2, program (row tile x KV head x node slot j, sequence b), after pass 1:
    the tile's j-th query node (none: the program ends) continues its rows' states from list
    position ``shared_end`` to its list end (the prefix keys of the last, partial prefix block,
    then its visible tree keys by increasing index, gathered in list order), loading and
    storing the state of every split it crosses; then its rows' splits are merged in split
    order and their output written. One node per program: a tile's nodes share no work here
    (each folds its own blocks with the tile's MMA shape, the other rows masked), so they run
    side by side instead of one after another.

    The node's slots in list order (the slot of its t-th visible tree key) are scattered once
    to ``slots_ptr`` (BLOCK_T int32 per program) and gathered per block."""
    row_tiles = tl.cdiv(num_queries * GROUP, BLOCK_M)
    unit = tl.program_id(0) // NODE_SLOTS
    kv_head = unit // row_tiles
    tile = unit % row_tiles
    b = tl.program_id(1)
    node = tile * BLOCK_M // GROUP + tl.program_id(0) % NODE_SLOTS
    if node > tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, num_queries - 1):
        return  # the tile has fewer nodes than slots

    row_ok, query, head, dims, dim_ok, q = _tile_rows(
        q_ptr, b, tile, kv_head, num_queries, stride_qb, stride_qn, stride_qh, GROUP, HEAD_DIM,
        BLOCK_D, BLOCK_M)
    mine = row_ok & (query == node)
    prefix = _clamped_prefix(lens_ptr, b, max_len, tree_keys)
    shared_end = prefix // BLOCK_N * BLOCK_N
    k_seq = k_ptr + b.to(tl.int64) * stride_kb + kv_head * stride_kh
    v_seq = v_ptr + b.to(tl.int64) * stride_kb + kv_head * stride_kh
    keys = tl.arange(0, BLOCK_N)
    nodes = tl.arange(0, BLOCK_T)
    slots = slots_ptr + (tl.program_id(1).to(tl.int64) * tl.num_programs(0)
                         + tl.program_id(0)) * BLOCK_T

    bits = tl.load(mask_ptr + (b.to(tl.int64) * num_queries + node) * words + nodes // 32,
                   mask=nodes < tree_keys, other=0)
    node_bits = (bits >> (nodes % 32)) & 1
    tl.store(slots + tl.cumsum(node_bits, 0) - 1, nodes, mask=node_bits != 0)
    tl.debug_barrier()  # the scatter above is read by other threads below
    node_end = prefix + tl.sum(node_bits, 0)
    held = tl.full([], -1, tl.int32)  # the split whose state m_i, l_i, acc hold
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for block in range(shared_end, node_end, BLOCK_N):
        split = block // split_keys
        if split != held:
            if held >= 0:
                part = _part_rows(b, held, num_splits, num_queries, q_heads, query, head)
                _store_state(part_o_ptr, part_ml_ptr, part, mine, dims, dim_ok, HEAD_DIM, m_i,
                             l_i, acc)
            part = _part_rows(b, split, num_splits, num_queries, q_heads, query, head)
            m_i, l_i, acc = _load_state(part_o_ptr, part_ml_ptr, part, mine, dims, dim_ok,
                                        HEAD_DIM)
            held = split
        pos = block + keys
        key_ok = pos < node_end
        tree_key = tl.load(slots + (pos - prefix), mask=key_ok & (pos >= prefix), other=0)
        rows_of = tl.where(pos < prefix, pos, prefix + tree_key)
        m_new, l_new, acc_new = _key_block(
            q, k_seq, v_seq, rows_of, mine[:, None] & key_ok[None, :], key_ok, dims, dim_ok,
            stride_kn, scale_log2, m_i, l_i, acc, DOT_PRECISION, UPCAST)
        m_i = tl.where(mine, m_new, m_i)
        l_i = tl.where(mine, l_new, l_i)
        acc = tl.where(mine[:, None], acc_new, acc)
    if held >= 0:
        part = _part_rows(b, held, num_splits, num_queries, q_heads, query, head)
        _store_state(part_o_ptr, part_ml_ptr, part, mine, dims, dim_ok, HEAD_DIM, m_i, l_i,
                     acc)
    tl.debug_barrier()  # the states stored above are read by other threads below

    # merge the splits in order: sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s (one split
    # gives acc / l exactly; a split that saw no key has weight 0 and would add exact zeros,
    # so the empty splits past the node's list are left out)
    used = tl.cdiv(node_end, split_keys)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for split in range(used):
        part = _part_rows(b, split, num_splits, num_queries, q_heads, query, head)
        top = tl.maximum(top, tl.load(part_ml_ptr + part * 2, mask=mine, other=float("-inf")))
    top = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros([BLOCK_M], tl.float32)
    out = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for split in range(used):
        part = _part_rows(b, split, num_splits, num_queries, q_heads, query, head)
        m_s, l_s, acc_s = _load_state(part_o_ptr, part_ml_ptr, part, mine, dims, dim_ok,
                                      HEAD_DIM)
        weight = tl.exp2(m_s - top)
        total += l_s * weight
        out += acc_s * weight[:, None]
    out = out / tl.where(total == 0.0, 1.0, total)[:, None]
    out_rows = out_ptr + b.to(tl.int64) * stride_qb + query * stride_qn + head * stride_qh
    tl.store(out_rows[:, None] + dims[None, :], _cast(out, out_ptr.dtype.element_ty, UPCAST),
             mask=mine[:, None] & dim_ok[None, :])


@triton.jit
def _tile_rows(q_ptr, b, tile, kv_head, num_queries, stride_qb, stride_qn, stride_qh,
               GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_M: tl.constexpr):
    """Row tile ``tile`` of KV head ``kv_head`` in sequence b: rows r -> (query r // GROUP, query
    head kv_head * GROUP + r % GROUP); returns (row_ok, query, head, dims, dim_ok, q), q being
    the tile's [BLOCK_M, BLOCK_D] query rows (0 past the rows and the head size)."""
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_queries * GROUP
    query = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + query * stride_qn + head * stride_qh
    q = tl.load(q_rows[:, None] + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    return row_ok, query, head, dims, dim_ok, q


@triton.jit
def _clamped_prefix(lens_ptr, b, max_len, tree_keys):
    """cache_lens[b] clamped to [0, max_len - T], so no key read leaves the sequence's cache
    whatever cache_lens holds (the op rejects such lengths only while value checks are on;
    csrc/attention.cuh clamped_prefix does the same)."""
    return tl.maximum(tl.minimum(tl.load(lens_ptr + b), max_len - tree_keys), 0)


@triton.jit
def _part_rows(b, split, num_splits, num_queries, q_heads, query, head):
    """Workspace rows (b, split, query, head) of [B, S, Nq, Hq] (int64)."""
    return ((b.to(tl.int64) * num_splits + split) * num_queries + query) * q_heads + head


@triton.jit
def _store_state(part_o_ptr, part_ml_ptr, part, rows, dims, dim_ok, HEAD_DIM: tl.constexpr,
                 m_i, l_i, acc):
    """A split's state of ``rows``: unnormalised output (only where the row saw a key: else it
    is 0, and empty splits are many in a big cache), max and sum (fp32, exact)."""
    seen = rows & (m_i != float("-inf"))
    tl.store(part_o_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc,
             mask=seen[:, None] & dim_ok[None, :])
    tl.store(part_ml_ptr + part * 2, m_i, mask=rows)
    tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=rows)


@triton.jit
def _load_state(part_o_ptr, part_ml_ptr, part, rows, dims, dim_ok, HEAD_DIM: tl.constexpr):
    """A split's state of ``rows`` (others: the empty state m = -inf, l = 0, acc = 0)."""
    m_i = tl.load(part_ml_ptr + part * 2, mask=rows, other=float("-inf"))
    l_i = tl.load(part_ml_ptr + part * 2 + 1, mask=rows, other=0.0)
    seen = rows & (m_i != float("-inf"))
    acc = tl.load(part_o_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                  mask=seen[:, None] & dim_ok[None, :], other=0.0)
    return m_i, l_i, acc


@triton.jit
def _tree_attention_kernel(
        q_ptr, k_ptr, v_ptr, lens_ptr, mask_ptr, out_ptr, part_o_ptr, part_ml_ptr,
        num_queries, q_heads, tree_keys, words, num_splits, max_len, scale_log2,
        stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Slot-order calls (T > ORDERED_MAX_TREE_KEYS: prefill chains, big trees), program (row
    tile x KV head, sequence b, split s): the prefix keys, then the tree keys in slot order with
    the ancestor bits, in ``num_splits`` equal chunks of ``[0, L + T)``. Writes ``out[b, i, h,
    :]`` ([B, Nq, Hq, D], strides of q) when not SPLIT, else the split's unnormalised output and
    its (max, sum) into the fp32 workspaces (merged by _merge_splits_kernel)."""
    row_tiles = tl.cdiv(num_queries * GROUP, BLOCK_M)
    kv_head = tl.program_id(0) // row_tiles  # neighbouring programs share a KV head (L2 reuse)
    tile = tl.program_id(0) % row_tiles
    b = tl.program_id(1)
    split = tl.program_id(2)

    row_ok, query, head, dims, dim_ok, q = _tile_rows(
        q_ptr, b, tile, kv_head, num_queries, stride_qb, stride_qn, stride_qh, GROUP, HEAD_DIM,
        BLOCK_D, BLOCK_M)

    prefix = _clamped_prefix(lens_ptr, b, max_len, tree_keys)
    mask_rows = mask_ptr + (b.to(tl.int64) * num_queries + query) * words
    list_end = prefix + tree_keys
    chunk = tl.cdiv(tl.cdiv(list_end, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, list_end)

    k_seq = k_ptr + b.to(tl.int64) * stride_kb + kv_head * stride_kh
    v_seq = v_ptr + b.to(tl.int64) * stride_kb + kv_head * stride_kh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    keys = tl.arange(0, BLOCK_N)
    every_row = tl.full([BLOCK_M], 1, tl.int1)

    # prefix keys: every row sees them, only the chunk end masks
    prefix_end = tl.minimum(end, prefix)
    for block in range(start, prefix_end, BLOCK_N):
        pos = block + keys
        key_ok = pos < prefix_end
        m_i, l_i, acc = _key_block(q, k_seq, v_seq, pos, every_row[:, None] & key_ok[None, :],
                                   key_ok, dims, dim_ok, stride_kn, scale_log2, m_i, l_i, acc,
                                   DOT_PRECISION, UPCAST)
    # tree keys: node j = pos - prefix, visible iff bit j % 32 of the row's word j // 32. A
    # block no row of the tile sees is skipped before its K / V are read (with a chain mask,
    # prefill, that is the half above the diagonal).
    for block in range(tl.maximum(start, prefix), end, BLOCK_N):
        pos = block + keys
        key_ok = pos < end
        node = pos - prefix
        bits = tl.load(mask_rows[:, None] + node[None, :] // 32,
                       mask=row_ok[:, None] & key_ok[None, :], other=0)
        seen = ((bits >> (node[None, :] % 32)) & 1) != 0
        if tl.max(tl.max(seen.to(tl.int32), 1), 0) > 0:
            m_i, l_i, acc = _key_block(q, k_seq, v_seq, pos, seen, key_ok, dims, dim_ok,
                                       stride_kn, scale_log2, m_i, l_i, acc,
                                       DOT_PRECISION, UPCAST)

    if SPLIT:
        # a row that saw no key here stores m = -inf and l = 0 only (the merge then reads no
        # output row for it)
        part = _part_rows(b, split, num_splits, num_queries, q_heads, query, head)
        seen = m_i != float("-inf")
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc,
                 mask=row_ok[:, None] & dim_ok[None, :] & seen[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # no visible key: acc is 0 -> zeros
        out_rows = out_ptr + b.to(tl.int64) * stride_qb + query * stride_qn + head * stride_qh
        tl.store(out_rows[:, None] + dims[None, :],
                 _cast(out, out_ptr.dtype.element_ty, UPCAST),
                 mask=row_ok[:, None] & dim_ok[None, :])


@triton.jit
def _merge_splits_kernel(part_o_ptr, part_ml_ptr, out_ptr, num_splits, rows_per_batch,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """Program per output row x = (b, query, head) of the contiguous [B, Nq, Hq, D] output:
    ``sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s`` over the splits in order (a fixed
    order, and one split gives ``acc / l`` exactly, as the unsplit kernel writes it); zeros
    when no split saw a key. (The interpreter cannot AND a scalar mask into a vector one.)"""
    x = tl.program_id(0).to(tl.int64)
    first = (x // rows_per_batch * num_splits) * rows_per_batch + x % rows_per_batch
    top = tl.full([], float("-inf"), tl.float32)
    for split in range(num_splits):
        top = tl.maximum(top, tl.load(part_ml_ptr + (first + split * rows_per_batch) * 2))
    top = tl.where(top == float("-inf"), 0.0, top)
    dims = tl.arange(0, BLOCK_D)
    total = tl.full([], 0.0, tl.float32)
    out = tl.zeros([BLOCK_D], tl.float32)
    for split in range(num_splits):
        part = first + split * rows_per_batch
        m = tl.load(part_ml_ptr + part * 2)
        weight = tl.exp2(m - top)  # 0 for a split that saw no key: its output is not stored
        total += tl.load(part_ml_ptr + part * 2 + 1) * weight
        seen = (tl.zeros([BLOCK_D], tl.float32) + m) != float("-inf")  # a vector: see below
        out += tl.load(part_o_ptr + part * HEAD_DIM + dims, mask=(dims < HEAD_DIM) & seen,
                       other=0.0) * weight
    out = out / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + x * HEAD_DIM + dims, _cast(out, out_ptr.dtype.element_ty, UPCAST),
             mask=dims < HEAD_DIM)


TRITON_MAX_HEAD_DIM = 256  # q, acc and a K / V block of BLOCK_D columns stay in registers


def _triton_supports(head_dim, **_) -> str | None:
    if head_dim > TRITON_MAX_HEAD_DIM:
        return (f"q: expected head_dim <= {TRITON_MAX_HEAD_DIM} "
                f"(attention_triton.TRITON_MAX_HEAD_DIM), "
                f"got {head_dim}")
    return None


class TritonConfig(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int


def triton_config(rows: int, head_dim: int, ordered: bool = True) -> TritonConfig:
    """Tile sizes: rows = Nq * group stacked query rows of one KV head. Ordered calls (decode,
    verify, drafting) take one tile shape whatever the rows, so that a row's MMAs are the same
    instructions in every call; prefill chains take FA2-like 64 x 64 tiles when rows are many.
    A 256-wide head halves the key block to stay in registers. To be tuned on a GPU."""
    block_m = TRITON_BLOCK_M if ordered or rows <= 16 else 32 if rows <= 32 else 64
    block_n = 32 if head_dim > 128 else 64
    return TritonConfig(block_m, block_n, 4)


def split_keys_for(max_len: int, block_n: int) -> int:
    """List positions per split of an ordered call: from the cache's capacity only (never N,
    the batch or the lengths), rounded to a power of two, so a decode step and a verify pass
    split every query's list at the same positions whenever their caches' capacities round to
    the same power of two (always MIN_SPLIT_KEYS up to MIN_SPLIT_KEYS * MAX_SPLITS keys; the
    runtime's plain and speculative caches differ by a tree's few rows)."""
    keys = max(MIN_SPLIT_KEYS, triton.next_power_of_2(max_len) // MAX_SPLITS)
    return triton.cdiv(keys, block_n) * block_n


def _tree_attention_triton(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale, tree_keys,
                           num_splits: int | None = None, prefix_block_m: int | None = None):
    """Triton backend (any head_dim up to 256; fp16 / bf16 / fp32 with fp32 accumulation).
    ``num_splits`` (tests) overrides the split count: :func:`split_keys_for` sets it for
    ordered calls (T <= ORDERED_MAX_TREE_KEYS), :func:`choose_num_splits` for the others.
    ``prefix_block_m`` (benchmarks, tests) gives the ordered pass 1 its own tile height instead
    of pass 2's. Pass 1 reads the prefix once per row tile, so a taller tile reads it fewer
    times (Nsight Compute on an H200, 4k keys, N = 60: 51 us at 16 rows, 20 us at 64, where
    pass 2 at 64 rows took 53 us against 31 at 16: 2026-11-28b); the state crosses to pass 2
    row by row, so the passes' tiles may differ, each fixed whatever N is (row invariance).
    Pass 2's height until a GPU run times another against it (bench_attention's triton_pm64).
    Slot-order calls (more tree keys) run one pass and take no such height."""
    batch, num_queries, q_heads, head_dim = q.shape
    _raise_unsupported("triton", _triton_supports(head_dim=head_dim))
    if prefix_block_m is not None and (prefix_block_m < 16
                                       or prefix_block_m & (prefix_block_m - 1)):
        raise ValueError(f"prefix_block_m: expected a power of two >= 16 (an MMA tile's rows), "
                         f"got {prefix_block_m}")
    kv_heads = k_cache.shape[2]
    group = q_heads // kv_heads
    ordered = tree_keys <= ORDERED_MAX_TREE_KEYS
    config = triton_config(num_queries * group, head_dim, ordered)
    row_tiles = triton.cdiv(num_queries * group, config.block_m)
    meta = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                BLOCK_M=config.block_m, BLOCK_N=config.block_n, DOT_PRECISION=dot_precision(q),
                UPCAST=interpreter_upcast(q), num_warps=config.num_warps, **EXACT_ROUNDING)
    scale = head_dim**-0.5 if sm_scale is None else float(sm_scale)
    if not ordered:
        return _slot_order_launch(q, k_cache, v_cache, cache_lens, tree_mask, tree_keys,
                                  num_splits, config, row_tiles * kv_heads, meta, scale * LOG2_E)
    return _ordered_launch(q, k_cache, v_cache, cache_lens, tree_mask, tree_keys, num_splits,
                           config, row_tiles * kv_heads, meta, scale * LOG2_E,
                           prefix_block_m or config.block_m)


def _strides(q, k_cache):
    return (q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
            k_cache.stride(2))


def _ordered_launch(q, k_cache, v_cache, cache_lens, tree_mask, tree_keys, num_splits, config,
                    tiles, meta, scale_log2, prefix_block_m):
    """The two ordered passes (row-invariant): shared prefix blocks per split (in tiles of
    ``prefix_block_m`` rows), then each node's own blocks and the merge (``tiles``: row tiles
    of ``config.block_m`` x KV heads). Splits of :func:`split_keys_for` list positions (or
    ``num_splits`` equal ones); the workspace always holds every split's state (one split
    included)."""
    batch, num_queries, q_heads, _ = q.shape
    max_len = k_cache.shape[1]
    split_keys = split_keys_for(max_len, config.block_n) if num_splits is None else \
        triton.cdiv(triton.cdiv(max_len, num_splits), config.block_n) * config.block_n
    num_splits = triton.cdiv(max_len, split_keys)
    part_o, part_ml = _workspace(q, num_splits, state=(2,), always=True)
    # pass 1 in tiles of its own height: its grid counts them
    prefix_tiles = triton.cdiv(num_queries * meta["GROUP"], prefix_block_m) * k_cache.shape[2]
    runs = splits_per_program(prefix_tiles * batch, num_splits, q.device)
    shape = (num_queries, q_heads, tree_keys)
    _prefix_splits_kernel[(prefix_tiles, batch, triton.cdiv(num_splits, runs))](
        q, k_cache, v_cache, cache_lens, part_o, part_ml, *shape, num_splits, split_keys,
        max_len, scale_log2, *_strides(q, k_cache), **dict(meta, BLOCK_M=prefix_block_m))
    block_t = triton.next_power_of_2(tree_keys)
    node_slots = (config.block_m - 1) // meta["GROUP"] + 2  # most nodes a row tile can touch
    slots = torch.empty(tiles * node_slots * batch * block_t, dtype=torch.int32, device=q.device)
    out = torch.empty_like(q)
    _tree_tail_kernel[(tiles * node_slots, batch)](
        q, k_cache, v_cache, cache_lens, tree_mask, out, part_o, part_ml, slots, *shape,
        tree_mask.shape[2], num_splits, split_keys, max_len, scale_log2,
        *_strides(q, k_cache), BLOCK_T=block_t, NODE_SLOTS=node_slots, **meta)
    return out


def _slot_order_launch(q, k_cache, v_cache, cache_lens, tree_mask, tree_keys, num_splits,
                       config, tiles, meta, scale_log2):
    """One pass over the prefix and the tree keys in slot order, split by
    :func:`choose_num_splits` (or ``num_splits``), merged by a second kernel when split."""
    batch, num_queries, q_heads, head_dim = q.shape
    max_len = k_cache.shape[1]
    if num_splits is None:
        num_splits = choose_num_splits(tiles * batch, max_len, q.device)
    out = torch.empty_like(q)
    part_o, part_ml = _workspace(q, num_splits, state=(2,))  # (max, sum) per row
    _tree_attention_kernel[(tiles, batch, num_splits)](
        q, k_cache, v_cache, cache_lens, tree_mask, out, part_o, part_ml, num_queries, q_heads,
        tree_keys, tree_mask.shape[2], num_splits, max_len, scale_log2,
        *_strides(q, k_cache), SPLIT=num_splits > 1, **meta)
    if num_splits > 1:
        _merge_splits_kernel[(batch * num_queries * q_heads,)](
            part_o, part_ml, out, num_splits, num_queries * q_heads, HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim), UPCAST=meta["UPCAST"], **EXACT_ROUNDING)
    return out


PREFIX_PROGRAMS_PER_SM = 4  # ordered pass 1: programs per SM to aim for (to be tuned on a GPU)


def splits_per_program(units: int, num_splits: int, device: torch.device) -> int:
    """Most splits one program of the ordered pass 1 runs (every ``cdiv(S, this)``-th split),
    ``units`` being its (row tile, KV head, sequence) count: about PREFIX_PROGRAMS_PER_SM
    programs per SM, so that many short splits do not each pay a program's start (each split
    still starts from a fresh state and is stored alone: the count changes no arithmetic)."""
    wanted = PREFIX_PROGRAMS_PER_SM * _sm_count(device)
    return max(1, min(num_splits, int(units * num_splits // wanted)))


register("tree_attention", "triton", _tree_attention_triton, auto=False,
         supports=_triton_supports)
