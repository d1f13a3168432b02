"""Tree attention: tree-node queries over the KV-cache prefix plus their tree ancestors.

Public op :func:`tree_attention` with the contract of
:func:`eagle_kernels.ops.reference.tree_attention`. It serves the target's verify pass (every
tree node is a query and a key), the draft head's drafting steps (a frontier of queries over
all nodes drafted so far) and prefill (a chain mask over T prompt keys). Backends: ``torch``
(reference), ``triton`` (below) and ``cuda`` (``csrc/attention.cu``, fp16 / bf16), the kernels
explicit only until proven on a GPU.

Kernel design (both kernels). FlashAttention-style online softmax in fp32 over key blocks that
are read once from the NHD cache in place. GQA: the ``group = Hq / Hkv`` query heads that share
a KV head are stacked as rows, so a tile of rows ``r -> (query r // group, head r % group)``
reads each K/V block once for the whole group (decode-like shapes have few queries but many
heads per KV head). A program owns one row tile of one KV head of one sequence; it walks the
prefix keys ``[0, L)`` with no mask but the length, then the tree keys ``[L, L + T)`` with the
packed ancestor bits (key j visible to query i iff bit ``j % 32`` of ``tree_mask[b, i, j // 32]``),
skipping any tree block that no row of the tile sees (half the blocks of a prefill chain).

Split-KV (flash-decoding). When the row tiles of a batch cannot fill the GPU (batch 1 verify:
``ceil(N * group / BLOCK_M) * Hkv`` programs against 132 SMs), each sequence's keys are cut
into splits (a multiple of BLOCK_N; the kernel reads the lengths from the device-side
``cache_lens``: no host sync, graph-capturable); each split writes its partial state to an fp32
workspace and a small second kernel merges them. The CUDA kernel cuts ``[0, L + T)`` into
``num_splits`` equal chunks, the count chosen on the host from shapes only
(:func:`choose_num_splits`, ``max_len`` standing in for the unknown prefix lengths).

Row invariance (Triton). Greedy speculative decoding is lossless by construction only if a
tree node's output is bit for bit a decode step's at its position. The Triton kernel gives that
for every tree of up to ORDERED_MAX_TREE_KEYS keys: one tile shape for every call, each row's
keys visited in list order (prefix, then its ancestors) in blocks and splits at fixed list
positions (splits from the cache capacity only, :func:`split_keys_for`), splits merged in
order. The CUDA kernel is not row-invariant (its splits and tiles depend on N and L).

A row that sees no key (possible only with an empty prefix and a row of zero bits) keeps
``m = -inf, l = 0`` and returns zeros, like the reference; the ``-inf`` guards below exist for
that row and for empty splits.
"""


from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from . import reference
from ._backend import cpu_extension, cuda_extension, cuda_limit, cuda_stream, register, resolve
from ._triton import tl, triton
from ._validate import (FLOAT_DTYPES, check_int, check_positive, check_range, check_same_device,
                        check_tensor, value_checks_enabled)


def tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale: float | None = None,
                   num_tree_keys: int | None = None, backend: str = "auto") -> torch.Tensor:
    """Attention of N tree-node queries over the prefix and their ancestors (packed mask).

    Parameters
    ----------
    q : [B, Nq, Hq, D] float16 / bfloat16 / float32, contiguous.
    k_cache, v_cache : [B, max_len, Hkv, D], dtype of ``q``, contiguous; ``Hq % Hkv == 0``;
        the T tree keys sit at ``[cache_lens[b], cache_lens[b] + T)``.
    cache_lens : [B] int32 committed prefix lengths, ``cache_lens[b] + T <= max_len``.
    tree_mask : [B, Nq, ceil(T / 32)] int32 packed ancestor bits.
    sm_scale : float, optional. Default ``D ** -0.5``.
    num_tree_keys : int, optional. T, default Nq.
    backend : "auto", "cuda", "triton" or "torch".

    Returns
    -------
    [B, Nq, Hq, D], dtype of ``q``.
    """
    check_tensor("q", q, FLOAT_DTYPES, (None, None, None, None))
    batch, num_queries, q_heads, head_dim = q.shape
    check_int("q.shape[1] (query count)", num_queries, 1)
    check_int("q.shape[3] (head_dim)", head_dim, 1)
    check_tensor("k_cache", k_cache, (q.dtype,), (batch, None, None, head_dim), q.device)
    check_tensor("v_cache", v_cache, (q.dtype,), tuple(k_cache.shape), q.device)
    kv_heads, max_len = k_cache.shape[2], k_cache.shape[1]
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"k_cache: expected a KV head count dividing the {q_heads} query heads, "
                         f"got {kv_heads}")
    tree_keys = check_int("num_tree_keys", num_queries if num_tree_keys is None else num_tree_keys,
                          1, max_len)
    check_tensor("cache_lens", cache_lens, (torch.int32,), (batch,), q.device)
    check_tensor("tree_mask", tree_mask, (torch.int32,),
                 (batch, num_queries, reference.mask_words(tree_keys)), q.device)
    check_same_device(q=q, k_cache=k_cache, cache_lens=cache_lens)
    check_range("cache_lens", cache_lens, 0, max_len - tree_keys + 1,
                f" (prefix plus {tree_keys} tree keys must fit max_len {max_len})")
    if sm_scale is not None:
        sm_scale = check_positive("sm_scale", sm_scale)
    if value_checks_enabled() and tree_keys % 32:
        spare = reference.unpack_tree_mask(tree_mask, reference.mask_words(tree_keys) * 32)
        if bool(spare[..., tree_keys:].any()):
            raise ValueError(f"tree_mask: bits past the {tree_keys} tree keys must be zero")
    aligned = all(t.data_ptr() % 16 == 0 for t in (q, k_cache, v_cache))
    _, implementation = resolve("tree_attention", backend, q.device, dtype=q.dtype,
                                head_dim=head_dim, aligned=aligned)
    return implementation(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale, tree_keys)




# --------------------------------------------------------------------------------------------
# Launch geometry shared by the Triton and CUDA kernels
# --------------------------------------------------------------------------------------------

MIN_SPLIT_KEYS = 256  # a split shorter than this costs more in the merge than it saves
MAX_SPLITS = 32


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # an H100's count: the interpreter then takes the splits a GPU would


def choose_num_splits(programs: int, max_keys: int, device: torch.device) -> int:
    """Key-range splits per (row tile, KV head, sequence) so that about two waves of programs
    fill the GPU, with at least MIN_SPLIT_KEYS keys per split. ``programs`` is the unsplit
    program count; ``max_keys`` bounds L + T (``max_len``: the true lengths live on the device)."""
    if programs <= 0:
        return 1
    wanted = math.ceil(2 * _sm_count(device) / programs)
    return max(1, min(wanted, MAX_SPLITS, max_keys // MIN_SPLIT_KEYS))


def _workspace(q: torch.Tensor, num_splits: int, state: tuple[int, ...] = ()):
    """fp32 partial outputs [B, S, Nq, Hq, D] and per-row split state [B, S, Nq, Hq, *state]
    (the CUDA kernel's base-2 log-sum-exps: state ``()``; the Triton kernel's (max, sum)
    pairs: ``(2,)``), never read when num_splits == 1."""
    if num_splits == 1:
        empty = torch.empty(0, dtype=torch.float32, device=q.device)
        return empty, empty
    batch, num_queries, q_heads, head_dim = q.shape
    rows = (batch, num_splits, num_queries, q_heads)
    return (torch.empty(*rows, head_dim, dtype=torch.float32, device=q.device),
            torch.empty(*rows, *state, dtype=torch.float32, device=q.device))


# --------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------

TRITON_BLOCK_M = 16  # rows per tile of every ordered call: one tile shape whatever N is
ORDERED_MAX_TREE_KEYS = 256  # trees up to this many keys reduce in position order (below)
# No multiply-add contraction on the GPU (the interpreter has none): the shared-prefix loop and
# the per-node loop fold the same block for a decode step and a tree node, and ptxas could
# contract their multiplies and adds differently (fma rounds once, mul + add twice).
EXACT_ROUNDING = {"enable_fp_fusion": False}


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
def _tree_attention_kernel(
        q_ptr, k_ptr, v_ptr, lens_ptr, mask_ptr, out_ptr, part_o_ptr, part_ml_ptr,
        num_queries, q_heads, tree_keys, words, num_splits, split_keys, max_len, scale_log2,
        stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
        ORDERED: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        UPCAST: tl.constexpr):
    """Program (row tile x KV head, sequence b, split s).

    Rows ``r`` of the tile are (query ``r // GROUP``, query head ``kv_head * GROUP + r %
    GROUP``). Writes ``out[b, i, h, :]`` ([B, Nq, Hq, D], strides of q) when not SPLIT, else the
    split's unnormalised output and its (max, sum) into the fp32 workspaces.

    ORDERED (T <= BLOCK_T): keys are visited in list order, the list of a row being the prefix
    [0, L) then its visible tree keys by increasing index (its ancestors: depth order, which is
    position order), cut into blocks of BLOCK_N list positions and splits of ``split_keys``
    list positions. Blocks wholly inside the prefix are shared by the tile; a block reaching
    past L is read once per query node of the tile, its columns gathered in list order. So a
    row's arithmetic depends only on its own list: a node at depth d over prefix L computes
    exactly what a decode step at position L + d computes over the committed cache. Otherwise
    the tree keys are walked in slot order with the ancestor bits (prefill chains, big trees).
    """
    row_tiles = tl.cdiv(num_queries * GROUP, BLOCK_M)
    kv_head = tl.program_id(0) // row_tiles  # neighbouring programs share a KV head (L2 reuse)
    tile = tl.program_id(0) % row_tiles
    b = tl.program_id(1)
    split = tl.program_id(2)

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_queries * GROUP
    query = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + query * stride_qn + head * stride_qh
    q = tl.load(q_rows[:, None] + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    # clamped to [0, max_len - T] so no key read leaves the sequence's cache whatever
    # cache_lens holds (the op rejects such lengths only while value checks are on);
    # csrc/attention.cuh clamped_prefix does the same
    prefix = tl.load(lens_ptr + b)
    prefix = tl.maximum(tl.minimum(prefix, max_len - tree_keys), 0)
    mask_rows = mask_ptr + (b.to(tl.int64) * num_queries + query) * words
    if ORDERED:
        # visible[r, j]: row r sees tree key j; a row's list ends at L + its visible count
        nodes = tl.arange(0, BLOCK_T)
        bits = tl.load(mask_rows[:, None] + nodes[None, :] // 32,
                       mask=row_ok[:, None] & (nodes < tree_keys)[None, :], other=0)
        visible = (bits >> (nodes[None, :] % 32)) & 1
        list_end = prefix + tl.max(tl.where(row_ok, tl.sum(visible, 1), 0), 0)
        chunk = split_keys
        shared_end = prefix // BLOCK_N * BLOCK_N  # blocks before it hold prefix keys only
    else:
        list_end = prefix + tree_keys
        chunk = tl.cdiv(tl.cdiv(list_end, num_splits), BLOCK_N) * BLOCK_N
        shared_end = prefix
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
    prefix_end = tl.minimum(end, shared_end)
    for block in range(start, prefix_end, BLOCK_N):
        pos = block + keys
        key_ok = pos < prefix_end
        m_i, l_i, acc = _key_block(q, k_seq, v_seq, pos, every_row[:, None] & key_ok[None, :],
                                   key_ok, dims, dim_ok, stride_kn, scale_log2, m_i, l_i, acc,
                                   DOT_PRECISION, UPCAST)

    if ORDERED:
        # list positions from the last prefix block on, one query node at a time: column c of
        # a block is list position t; t < L is prefix key t, else the node's (t - L)-th
        # visible tree key, found by its rank among the node's visible bits
        first_node = tile * BLOCK_M // GROUP
        last_node = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, num_queries - 1)
        for node in range(first_node, last_node + 1):
            mine = query == node
            node_bits = tl.max(tl.where(mine[:, None], visible, 0), 0)  # [BLOCK_T]
            rank = tl.cumsum(node_bits, 0) - 1
            node_end = tl.minimum(end, prefix + tl.sum(node_bits, 0))
            for block in range(tl.maximum(start, shared_end), node_end, BLOCK_N):
                pos = block + keys
                wanted = pos - prefix  # rank of the tree key at this list position
                hit = (node_bits[None, :] != 0) & (rank[None, :] == wanted[:, None])
                slot = prefix + tl.sum(tl.where(hit, nodes[None, :], 0), 1)
                key_ok = pos < node_end
                rows_of = tl.where(pos < prefix, pos, slot)
                m_new, l_new, acc_new = _key_block(
                    q, k_seq, v_seq, rows_of, mine[:, None] & key_ok[None, :], key_ok, dims,
                    dim_ok, stride_kn, scale_log2, m_i, l_i, acc, DOT_PRECISION, UPCAST)
                m_i = tl.where(mine, m_new, m_i)
                l_i = tl.where(mine, l_new, l_i)
                acc = tl.where(mine[:, None], acc_new, acc)
    else:
        # tree keys: node j = pos - prefix, visible iff bit j % 32 of the row's word j // 32. A
        # block no row of the tile sees is skipped before its K / V are read (with a chain
        # mask, prefill, that is the half above the diagonal).
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

    out_mask = row_ok[:, None] & dim_ok[None, :]
    if SPLIT:
        # workspace rows (b, split, query, head) of [B, S, Nq, Hq]: unnormalised, merged in
        # split order by _merge_splits_kernel; a row that saw no key here stores m = -inf and
        # l = 0 only (the merge then reads no output row for it)
        part = ((b.to(tl.int64) * num_splits + split) * num_queries + query) * q_heads + head
        seen = m_i != float("-inf")
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc,
                 mask=out_mask & seen[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # no visible key: acc is 0 -> zeros
        out_rows = out_ptr + b.to(tl.int64) * stride_qb + query * stride_qn + head * stride_qh
        tl.store(out_rows[:, None] + dims[None, :],
                 _cast(out, out_ptr.dtype.element_ty, UPCAST), mask=out_mask)


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
        return (f"q: expected head_dim <= {TRITON_MAX_HEAD_DIM} (attention.TRITON_MAX_HEAD_DIM), "
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
                           num_splits: int | None = None):
    """Triton backend (any head_dim up to 256; fp16 / bf16 / fp32 with fp32 accumulation).
    ``num_splits`` (tests) overrides the split count: :func:`split_keys_for` sets it for
    ordered calls (T <= ORDERED_MAX_TREE_KEYS), :func:`choose_num_splits` for the others."""
    batch, num_queries, q_heads, head_dim = q.shape
    _raise_unsupported("triton", _triton_supports(head_dim=head_dim))
    kv_heads, max_len = k_cache.shape[2], k_cache.shape[1]
    group = q_heads // kv_heads
    scale = head_dim**-0.5 if sm_scale is None else float(sm_scale)
    ordered = tree_keys <= ORDERED_MAX_TREE_KEYS
    config = triton_config(num_queries * group, head_dim, ordered)
    row_tiles = triton.cdiv(num_queries * group, config.block_m)
    split_keys = 0
    if ordered:
        split_keys = split_keys_for(max_len, config.block_n) if num_splits is None else \
            triton.cdiv(triton.cdiv(max_len, num_splits), config.block_n) * config.block_n
        num_splits = triton.cdiv(max_len, split_keys)
    elif num_splits is None:
        num_splits = choose_num_splits(row_tiles * kv_heads * batch, max_len, q.device)
    out = torch.empty_like(q)
    part_o, part_ml = _workspace(q, num_splits, state=(2,))  # (max, sum) per row
    grid = (row_tiles * kv_heads, batch, num_splits)
    upcast = interpreter_upcast(q)
    _tree_attention_kernel[grid](
        q, k_cache, v_cache, cache_lens, tree_mask, out, part_o, part_ml,
        num_queries, q_heads, tree_keys, tree_mask.shape[2], num_splits, split_keys, max_len,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_T=triton.next_power_of_2(tree_keys) if ordered else 1, ORDERED=ordered,
        SPLIT=num_splits > 1, DOT_PRECISION=dot_precision(q),
        UPCAST=upcast, num_warps=config.num_warps, **EXACT_ROUNDING)
    if num_splits > 1:
        _merge_splits_kernel[(batch * num_queries * q_heads,)](
            part_o, part_ml, out, num_splits, num_queries * q_heads, HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim), UPCAST=upcast, **EXACT_ROUNDING)
    return out


# --------------------------------------------------------------------------------------------
# CUDA (csrc/attention.cu)
# --------------------------------------------------------------------------------------------

CUDA_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # common.cuh DtypeCode
CUDA_BLOCK_M = 64  # rows per CTA of the CUDA kernel (attention.cuh kBlockM)


def _cuda_supports(dtype, head_dim, aligned=True, **_) -> str | None:
    """What csrc/attention.cu takes: dtypes and head sizes exported by ``_C``
    (ATTENTION_DTYPE_CODES, ATTENTION_HEAD_DIMS), and 16-byte aligned q / k / v."""
    codes = cuda_limit("ATTENTION_DTYPE_CODES")
    if codes is None:  # _C not built: the cuda backend is unavailable anyway
        return None
    if CUDA_DTYPE_CODES.get(dtype) not in codes:
        names = " or ".join(str(d).replace("torch.", "") for d, c in CUDA_DTYPE_CODES.items()
                            if c in codes)
        return f"q: expected dtype {names} (_C.ATTENTION_DTYPE_CODES), got {dtype}"
    head_dims = tuple(cuda_limit("ATTENTION_HEAD_DIMS"))
    if head_dim not in head_dims:
        return f"q: expected head_dim in {head_dims} (_C.ATTENTION_HEAD_DIMS), got {head_dim}"
    if not aligned:
        return ("q, k_cache, v_cache: expected 16-byte aligned data (the kernel loads rows in "
                "16-byte vectors)")
    return None


def _raise_unsupported(backend: str, reason: str | None) -> None:
    """Direct calls of a backend function (tests, benchmarks) get the resolve() error too."""
    if reason is not None:
        raise ValueError(f"backend: {backend!r} cannot run tree_attention here: {reason}")


def _tree_attention_cuda(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale, tree_keys,
                         num_splits: int | None = None):
    """CUDA backend: fp16 / bf16, head_dim 64 or 128 (tensor-core tiles of 16)."""
    batch, num_queries, q_heads, head_dim = q.shape
    _raise_unsupported("cuda", _cuda_supports(
        q.dtype, head_dim, all(t.data_ptr() % 16 == 0 for t in (q, k_cache, v_cache))))
    kv_heads, max_len = k_cache.shape[2], k_cache.shape[1]
    group = q_heads // kv_heads
    row_tiles = triton.cdiv(num_queries * group, CUDA_BLOCK_M)
    if num_splits is None:
        num_splits = choose_num_splits(row_tiles * kv_heads * batch, max_len, q.device)
    out = torch.empty_like(q)
    part_o, part_lse = _workspace(q, num_splits)
    scale = head_dim**-0.5 if sm_scale is None else float(sm_scale)
    cuda_extension().tree_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), cache_lens.data_ptr(),
        tree_mask.data_ptr(), out.data_ptr(), part_o.data_ptr(), part_lse.data_ptr(),
        batch, num_queries, q_heads, kv_heads, head_dim, tree_keys, tree_mask.shape[2],
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), num_splits, scale, CUDA_DTYPE_CODES[q.dtype], cuda_stream(q.device))
    return out


# --------------------------------------------------------------------------------------------
# CPU (csrc/cpu/attention.h)
# --------------------------------------------------------------------------------------------


def _tree_attention_cpu(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale, tree_keys):
    """cpu backend: fp32; each query reduces over its visible keys in position order (prefix,
    then ancestors; value sums in fixed blocks of positions), so a node's output equals a
    decode step's at its position bit for bit."""
    batch, num_queries, q_heads, head_dim = q.shape
    out = torch.empty_like(q)
    scale = head_dim**-0.5 if sm_scale is None else float(sm_scale)
    cpu_extension().tree_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), cache_lens.data_ptr(),
        tree_mask.data_ptr(), out.data_ptr(), batch, num_queries, q_heads, k_cache.shape[2],
        head_dim, k_cache.shape[1], tree_keys, tree_mask.shape[2], scale)
    return out


def _cpu_supports(dtype, **_) -> str | None:
    return None if dtype == torch.float32 else f"takes float32 tensors, got {dtype}"


register("tree_attention", "torch", reference.tree_attention)
register("tree_attention", "triton", _tree_attention_triton, auto=False,
         supports=_triton_supports)
register("tree_attention", "cuda", _tree_attention_cuda, auto=False, supports=_cuda_supports)
register("tree_attention", "cpu", _tree_attention_cpu, supports=_cpu_supports)
