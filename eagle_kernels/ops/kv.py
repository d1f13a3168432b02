"""KV cache writes: a pass's new K/V rows, and the accepted path moved next to the prefix.

Public ops :func:`write_kv`, :func:`rope_write_kv` and :func:`compact_kv` with the contracts of
the same-named functions in :mod:`eagle_kernels.ops.reference` (caches written in place).
``write_kv``: ``torch`` (reference: index arithmetic and two indexed stores, ~7 launches on a
GPU, every layer of every pass) and ``triton`` (one launch for K and V). ``rope_write_kv`` (the
attention's prologue: RoPE of q and k, then write_kv): ``torch`` (those ops) and ``triton`` (one
launch where apply_rope, apply_rope and write_kv take three). Both Tritons explicit only until
proven on a GPU.
``compact_kv`` (every layer's K and V cache in one call): ``cpu`` (``csrc/cpu/kv.h``, one C++
call for every cache), ``torch`` (reference), and ``triton`` / ``cuda`` (``csrc/kv.cu``),
explicit only until proven on a GPU.

Both kernels copy raw words, so caches may differ in head count, head size and dtype: one
launch, grid (cache, sequence, column chunk). A program walks its sequence's accepted path in
ascending order j = 1..n-1, copying row ``L + node_j`` to ``L + j`` for its columns. Sequential j
within a program keeps the in-place move safe: row ``L + j`` is only written after every row a
smaller j reads (``node_j' >= j'``), and a later read ``L + node_j'`` (``node_j' > node_j >= j``)
is never a row written before it. The word is the largest of 16 (CUDA) / 8 / 4 / 2 / 1 bytes
dividing every row size and cache address. The per-cache table (addresses, row sizes) is built
on the host once per set of caches and cached, so calls under CUDA-graph capture (after a
warm-up call with the same caches) do no host-to-device copies.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from . import reference
from ._backend import cpu_extension, cuda_extension, cuda_stream, register, resolve
from ._triton import tl, triton
from ._validate import (FLOAT_DTYPES, check_int, check_range, check_tensor, first_found,
                        value_checks_enabled)
from .attention_triton import EXACT_ROUNDING, interpreter_upcast
from .decoder import check_rope
from .decoder_triton import _rope_heads, rope_blocks


def write_kv(k, v, k_cache, v_cache, cache_lens, offset: int = 0, backend: str = "auto") -> None:
    """Store ``k`` / ``v`` at rows ``cache_lens[b] + offset + t`` of the caches, in place.

    Parameters
    ----------
    k, v : [B, T, H, D] float, contiguous, the caches' dtype.
    k_cache, v_cache : [B, max_len, H, D], contiguous.
    cache_lens : [B] int32; ``0 <= cache_lens[b]`` and ``cache_lens[b] + offset + T <= max_len``
        (checked with value checks on; with them off the triton kernel writes no row outside
        the cache, the torch reference raises an IndexError past the end and wraps a negative
        row into the sequence's own, as torch indexing does).
    offset : int >= 0.
    backend : "auto", "triton" or "torch".
    """
    _check_write(k, v, k_cache, v_cache, cache_lens, offset)
    _, implementation = resolve("write_kv", backend, k.device)
    implementation(k, v, k_cache, v_cache, cache_lens, offset)


def _check_write(k, v, k_cache, v_cache, cache_lens, offset) -> None:
    """write_kv's argument checks."""
    first = check_tensor("k", k, FLOAT_DTYPES, (None, None, None, None))
    batch, count, heads, dim = first.shape
    check_tensor("v", v, (k.dtype,), tuple(k.shape), k.device)
    check_tensor("k_cache", k_cache, (k.dtype,), (batch, None, heads, dim), k.device)
    check_tensor("v_cache", v_cache, (k.dtype,), tuple(k_cache.shape), k.device)
    check_tensor("cache_lens", cache_lens, (torch.int32,), (batch,), k.device)
    max_len = k_cache.shape[1]
    check_int("offset", offset, 0, max_len)  # bounded even with no new rows (no int64 overflow)
    if count and offset + count > max_len:
        raise ValueError(f"k: {count} new rows past offset {offset} do not fit the caches' "
                         f"max_len {max_len}")
    if value_checks_enabled() and batch and count:
        check_range("cache_lens", cache_lens, 0, max_len - offset - count + 1,
                    f" (max_len {max_len} minus offset {offset} and {count} new rows)")


def rope_write_kv(q, k, v, positions, cos, sin, k_cache, v_cache, cache_lens, offset: int = 0,
                  backend: str = "auto") -> torch.Tensor:
    """Rotate ``q`` and ``k`` (:func:`eagle_kernels.ops.apply_rope`) and store the rotated ``k``
    and ``v`` as :func:`write_kv` does: an attention layer's prologue, one launch with the
    Triton backend where the separate ops take three.

    Parameters
    ----------
    q : [B, T, Hq, D] float, contiguous (D even).
    k, v : [B, T, H, D], q's dtype, contiguous.
    positions : [B, T] int64, each in ``[0, P)``.
    cos, sin : [P, D] tables in q's dtype.
    k_cache, v_cache, cache_lens, offset : as :func:`write_kv` (with value checks off, Triton
        writes no row outside the caches; the torch reference behaves as write_kv's).
    backend : "auto", "triton" or "torch".

    Returns
    -------
    The rotated ``q`` [B, T, Hq, D]; the caches hold the rotated ``k`` and ``v``, bit for bit
    what apply_rope then write_kv leave (the reference is those two ops).
    """
    check_tensor("q", q, FLOAT_DTYPES, (None, None, None, None))  # q.numel() for the tables
    check_tensor("k", k, FLOAT_DTYPES, (None, None, None, None))  # k.numel() for the tables
    check_rope("q", q, positions, cos, sin, rotated=q.numel() + k.numel())
    check_tensor("k", k, (q.dtype,), (q.shape[0], q.shape[1], None, q.shape[3]), q.device)
    _check_write(k, v, k_cache, v_cache, cache_lens, offset)
    _, implementation = resolve("rope_write_kv", backend, q.device, dtype=q.dtype)
    return implementation(q, k, v, positions, cos, sin, k_cache, v_cache, cache_lens, offset)


def compact_kv(caches: Sequence[torch.Tensor], cache_lens, accepted_nodes, num_accepted,
               backend: str = "auto") -> None:
    """Copy entry ``cache_lens[b] + accepted_nodes[b, j]`` to ``cache_lens[b] + j`` in place.

    Parameters
    ----------
    caches : sequence of [B, max_len, H, D] tensors (every layer's K and V), contiguous, on one
        device; shapes may differ between layers but B and max_len may not.
    cache_lens : [B] int32 committed lengths before this step.
    accepted_nodes : [B, W] int32 root then accepted node indices, -1 padded.
    num_accepted : [B] int32, ``0 <= num_accepted[b] < W``.
    backend : "auto", "cpu", "cuda", "triton" or "torch".
    """
    if isinstance(caches, torch.Tensor) or not isinstance(caches, (list, tuple)) or not caches:
        raise TypeError("caches: expected a non-empty list or tuple of [B, max_len, H, D] tensors")
    first = check_tensor("caches[0]", caches[0], None, (None, None, None, None))
    batch, max_len = first.shape[:2]
    device = first.device
    for index, cache in enumerate(caches):  # a fast yes; check_tensor names what is wrong
        shape = cache.shape if isinstance(cache, torch.Tensor) else ()
        if not (len(shape) == 4 and shape[0] == batch and shape[1] == max_len
                and cache.device == device and cache.is_contiguous()):
            check_tensor(f"caches[{index}]", cache, None, (batch, max_len, None, None),
                         first.device)
    check_tensor("cache_lens", cache_lens, (torch.int32,), (batch,), first.device)
    check_tensor("accepted_nodes", accepted_nodes, (torch.int32,), (batch, None), first.device)
    if accepted_nodes.shape[1] == 0:
        raise ValueError(f"accepted_nodes: expected at least one column (the root), got shape "
                         f"{tuple(accepted_nodes.shape)}")
    check_tensor("num_accepted", num_accepted, (torch.int32,), (batch,), first.device)
    width = accepted_nodes.shape[1]
    check_range("num_accepted", num_accepted, 0, width, " (accepted_nodes has that many columns)")
    check_range("cache_lens", cache_lens, 0, max_len + 1, f" (max_len {max_len})")
    # The disjoint check syncs nothing but costs ~50 us at 60 caches: with the value checks,
    # off in the runtime's loop, which passes its own caches.
    if value_checks_enabled():
        _check_disjoint(caches)
        _check_accepted_path(cache_lens, accepted_nodes, num_accepted, max_len)
    _, implementation = resolve("compact_kv", backend, first.device)
    implementation(list(caches), cache_lens, accepted_nodes, num_accepted)


def _check_disjoint(caches: Sequence[torch.Tensor]) -> None:
    """No two caches share memory (no host sync: addresses only). The kernels move every
    cache's rows at once, the reference one cache after another: a cache given twice would
    be moved twice, differently by each (and raced on a GPU)."""
    spans = sorted((cache.data_ptr(), cache.data_ptr() + cache.numel() * cache.element_size(),
                    index) for index, cache in enumerate(caches) if cache.numel())
    end, owner = -1, -1
    for start, stop, index in spans:
        if start < end:
            first, second = sorted((owner, index))
            raise ValueError(f"caches[{second}]: expected memory of its own, got memory shared "
                             f"with caches[{first}]")
        if stop > end:
            end, owner = stop, index


def _check_accepted_path(cache_lens, accepted_nodes, num_accepted, max_len: int) -> None:
    """Root first, strictly increasing node indices, every source and target inside the cache."""
    column = torch.arange(accepted_nodes.shape[1], device=accepted_nodes.device)
    used = column <= num_accepted.unsqueeze(1)
    bad = accepted_nodes[:, 0] != 0
    if bool(bad.any()):
        raise ValueError(f"accepted_nodes: expected the root (node 0) in column 0, "
                         f"{first_found(accepted_nodes[:, 0], bad)}")
    steps = accepted_nodes[:, 1:] - accepted_nodes[:, :-1]
    bad = (steps <= 0) & used[:, 1:]
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"accepted_nodes: expected strictly increasing node indices along the "
                         f"path, got row {row}: {accepted_nodes[row].tolist()}")
    source_end = cache_lens + torch.where(used, accepted_nodes, 0).amax(1)
    check_range("cache_lens + accepted_nodes", source_end, 0, max_len, " (inside the cache)")


class _Layout(NamedTuple):
    """Device table of a set of caches: per cache its address (or byte offset from the first)
    and its row size in words; the word size; the largest row."""

    addresses: torch.Tensor
    row_words: torch.Tensor
    word_bytes: int
    max_row_words: int


_LAYOUTS: dict[tuple, _Layout] = {}


def _word_bytes(caches: Sequence[torch.Tensor], largest: int) -> int:
    row_bytes = [cache[0, 0].numel() * cache.element_size() for cache in caches]
    for word in (16, 8, 4, 2, 1):
        if word <= largest and all(size % word == 0 for size in row_bytes) and all(
                cache.data_ptr() % word == 0 for cache in caches):
            return word
    return 1


def _layout(caches: Sequence[torch.Tensor], relative: bool, largest_word: int) -> _Layout:
    """The (cached) device table; ``relative``: byte offsets from caches[0] (Triton adds them
    to its first pointer argument), else absolute addresses (CUDA)."""
    key = (relative, caches[0].device) + tuple(
        (cache.data_ptr(), tuple(cache.shape), cache.dtype) for cache in caches)
    layout = _LAYOUTS.get(key)
    if layout is None:
        word = _word_bytes(caches, largest_word)
        base = caches[0].data_ptr() if relative else 0
        row_words = [cache[0, 0].numel() * cache.element_size() // word for cache in caches]
        device = caches[0].device
        layout = _Layout(
            torch.tensor([cache.data_ptr() - base for cache in caches], dtype=torch.int64,
                         device=device),
            torch.tensor(row_words, dtype=torch.int64, device=device), word, max(row_words))
        if len(_LAYOUTS) > 64:  # a runtime uses one set of caches: keep the table small
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    return layout


@triton.jit
def _compact_kv_kernel(base_ptr, offsets_ptr, row_words_ptr, cache_lens_ptr, nodes_ptr,
                       num_accepted_ptr, max_len, width, WORD_BYTES: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Program (cache c, sequence b, chunk): move this chunk of columns along b's path."""
    c = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row_words = tl.load(row_words_ptr + c)
    raw = base_ptr.to(tl.pointer_type(tl.int8)) + tl.load(offsets_ptr + c)
    if WORD_BYTES == 8:
        cache = raw.to(tl.pointer_type(tl.int64))
    elif WORD_BYTES == 4:
        cache = raw.to(tl.pointer_type(tl.int32))
    elif WORD_BYTES == 2:
        cache = raw.to(tl.pointer_type(tl.int16))
    else:
        cache = raw
    seq = cache + b * max_len * row_words
    prefix = tl.load(cache_lens_ptr + b).to(tl.int64)
    count = tl.minimum(tl.load(num_accepted_ptr + b) + 1, width)
    for j in range(1, count):
        node = tl.load(nodes_ptr + b * width + j).to(tl.int64)
        # a node already in place needs no copy, and a move whose source or target row is
        # outside this sequence's [0, max_len) (out-of-contract input, unchecked under graph
        # capture) is skipped like csrc/kv.cuh does (scalars folded into the bound: the
        # interpreter rejects masks that combine a vector and a scalar condition)
        inside = (node >= 0) & (prefix >= 0) & (prefix + node < max_len) & (prefix + j < max_len)
        mask = cols < tl.where((node != j) & inside, row_words, 0)
        words = tl.load(seq + (prefix + node) * row_words + cols, mask=mask)
        tl.store(seq + (prefix + j) * row_words + cols, words, mask=mask)


def _compact_kv_triton(caches, cache_lens, accepted_nodes, num_accepted) -> None:
    batch, max_len = caches[0].shape[:2]
    layout = _layout(caches, relative=True, largest_word=8)
    block = min(1024, triton.next_power_of_2(max(layout.max_row_words, 1)))
    grid = (len(caches), batch, triton.cdiv(layout.max_row_words, block))
    if batch and layout.max_row_words:
        _compact_kv_kernel[grid](caches[0], layout.addresses, layout.row_words, cache_lens,
                                 accepted_nodes, num_accepted, max_len, accepted_nodes.shape[1],
                                 WORD_BYTES=layout.word_bytes, BLOCK=block)


def _compact_kv_cuda(caches, cache_lens, accepted_nodes, num_accepted) -> None:
    batch, max_len = caches[0].shape[:2]
    layout = _layout(caches, relative=False, largest_word=16)
    stream = cuda_stream(caches[0].device)
    cuda_extension().compact_kv(layout.addresses.data_ptr(), layout.row_words.data_ptr(),
                                len(caches), cache_lens.data_ptr(), accepted_nodes.data_ptr(),
                                num_accepted.data_ptr(), batch, max_len, accepted_nodes.shape[1],
                                layout.word_bytes, layout.max_row_words, stream)


def _compact_kv_cpu(caches, cache_lens, accepted_nodes, num_accepted) -> None:
    """cpu backend (csrc/cpu/kv.h): one call moves the rows of every cache, any dtype."""
    batch, max_len = caches[0].shape[:2]
    rows = [(cache.data_ptr(), cache.shape[2] * cache.shape[3] * cache.element_size())
            for cache in caches]
    rows = [row for row in rows if row[1]]  # caches of empty rows: nothing to move
    if not (batch and max_len and accepted_nodes.shape[1] and rows):
        return
    cpu_extension().compact_kv([address for address, _ in rows], [size for _, size in rows],
                               cache_lens.data_ptr(), accepted_nodes.data_ptr(),
                               num_accepted.data_ptr(), batch, max_len, accepted_nodes.shape[1])


WRITE_KV_BLOCK = 1024  # row elements per program


@triton.jit(do_not_specialize=["count", "offset"])  # both vary while a tree is drafted
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, lens_ptr, count, max_len, offset,
                     row_size, BLOCK: tl.constexpr):
    """Program (token b * T + t, column block): row t of k / v to row lens[b] + offset + t of
    the caches; a row outside [0, max_len) (out-of-contract lengths, value checks off) is not
    written."""
    token = tl.program_id(0).to(tl.int64)
    b = token // count
    row = tl.load(lens_ptr + b).to(tl.int64) + offset + token % count
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    # the row test folded into the bound (the interpreter rejects a block mask and'ed with a
    # scalar one)
    ok = cols < tl.where((row >= 0) & (row < max_len), row_size, 0)
    target = (b * max_len + row) * row_size + cols
    tl.store(k_cache_ptr + target, tl.load(k_ptr + token * row_size + cols, mask=ok), mask=ok)
    tl.store(v_cache_ptr + target, tl.load(v_ptr + token * row_size + cols, mask=ok), mask=ok)


def _write_kv_triton(k, v, k_cache, v_cache, cache_lens, offset) -> None:
    batch, count, heads, dim = k.shape
    row_size = heads * dim
    if batch and count and row_size:
        block = min(WRITE_KV_BLOCK, triton.next_power_of_2(row_size))
        _write_kv_kernel[(batch * count, triton.cdiv(row_size, block))](
            k, v, k_cache, v_cache, cache_lens, count, k_cache.shape[1], offset, row_size,
            BLOCK=block)


@triton.jit(do_not_specialize=["count", "offset"])
def _rope_write_kv_kernel(q_ptr, k_ptr, v_ptr, positions_ptr, cos_ptr, sin_ptr, q_out_ptr,
                          k_cache_ptr, v_cache_ptr, lens_ptr, count, q_heads, kv_heads,
                          table_rows, max_len, offset, DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                          BLOCK_KV: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """Program (token b * T + t, head block): the BLOCK_H-head blocks of q (rotated into q_out),
    then the BLOCK_KV-head blocks of k (rotated into row lens[b] + offset + t of k_cache), then
    of v (copied into that row of v_cache). A cache row outside [0, max_len) (out-of-contract
    lengths, value checks off) is not written."""
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    q_blocks = tl.cdiv(q_heads, BLOCK_H)
    kv_blocks = tl.cdiv(kv_heads, BLOCK_KV)
    b = token // count
    row = tl.load(lens_ptr + b).to(tl.int64) + offset + token % count
    # the row test folded into the head bound (the interpreter rejects a block mask and'ed with
    # a scalar one)
    cache_heads = tl.where((row >= 0) & (row < max_len), kv_heads, 0)
    cache_row = (b * max_len + row) * kv_heads * DIM
    if block < q_blocks:
        # a name per branch: the branches' head tiles differ in shape (BLOCK_H, BLOCK_KV)
        q_head = block * BLOCK_H + tl.arange(0, BLOCK_H)
        first_head = token * q_heads * DIM
        _rope_heads(q_ptr + first_head, q_out_ptr + first_head, q_head, q_heads, positions_ptr,
                    cos_ptr, sin_ptr, token, table_rows, DIM, BLOCK_D, UPCAST)
    elif block < q_blocks + kv_blocks:
        k_head = (block - q_blocks) * BLOCK_KV + tl.arange(0, BLOCK_KV)
        _rope_heads(k_ptr + token * kv_heads * DIM, k_cache_ptr + cache_row, k_head, cache_heads,
                    positions_ptr, cos_ptr, sin_ptr, token, table_rows, DIM, BLOCK_D, UPCAST)
    else:
        v_head = (block - q_blocks - kv_blocks) * BLOCK_KV + tl.arange(0, BLOCK_KV)
        d = tl.arange(0, BLOCK_D)
        ok = (v_head < cache_heads)[:, None] & (d < DIM)[None, :]
        offsets = v_head[:, None] * DIM + d[None, :]
        values = tl.load(v_ptr + token * kv_heads * DIM + offsets, mask=ok)
        tl.store(v_cache_ptr + cache_row + offsets, values, mask=ok)


def _rope_write_kv_triton(q, k, v, positions, cos, sin, k_cache, v_cache, cache_lens, offset):
    """Triton backend of rope_write_kv (checked arguments): one launch."""
    batch, count, q_heads, dim = q.shape
    kv_heads = k.shape[2]
    q_out = torch.empty_like(q)
    if batch and count and dim and (q_heads or kv_heads):
        block_h, block_d = rope_blocks(q_heads, dim)
        block_kv, _ = rope_blocks(kv_heads, dim)
        blocks = triton.cdiv(q_heads, block_h) + 2 * triton.cdiv(kv_heads, block_kv)
        _rope_write_kv_kernel[(batch * count, blocks)](
            q, k, v, positions, cos, sin, q_out, k_cache, v_cache, cache_lens, count, q_heads,
            kv_heads, cos.shape[0], k_cache.shape[1], offset, DIM=dim, BLOCK_H=block_h,
            BLOCK_KV=block_kv, BLOCK_D=block_d, UPCAST=interpreter_upcast(q), num_warps=4,
            **EXACT_ROUNDING)
    return q_out


register("write_kv", "torch", reference.write_kv)
register("write_kv", "triton", _write_kv_triton, auto=False)
register("rope_write_kv", "torch", reference.rope_write_kv)
register("rope_write_kv", "triton", _rope_write_kv_triton, auto=False)
register("compact_kv", "cpu", _compact_kv_cpu)
register("compact_kv", "torch", reference.compact_kv)
register("compact_kv", "triton", _compact_kv_triton, auto=False)
register("compact_kv", "cuda", _compact_kv_cuda, auto=False)
