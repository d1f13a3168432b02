"""Tree attention: tree-node queries over the KV-cache prefix plus their tree ancestors.

Public op :func:`tree_attention` with the contract of
:func:`eagle_kernels.ops.reference.tree_attention`. It serves the target's verify pass (every
tree node is a query and a key), the draft head's drafting steps (a frontier of queries over
all nodes drafted so far) and prefill (a chain mask over T prompt keys). Backends: ``torch``
(reference), ``triton`` (:mod:`~eagle_kernels.ops.attention_triton`), ``cpu``
(``csrc/cpu/attention.h``, fp32) and ``cuda`` (``csrc/attention.cu``, fp16 / bf16), the GPU kernels
explicit only until proven on a GPU.

Kernel design (every kernel). FlashAttention-style online softmax in fp32 over key blocks that
are read once from the NHD cache in place. GQA: the ``group = Hq / Hkv`` query heads that share
a KV head are stacked as rows, so a tile of rows ``r -> (query r // group, head r % group)``
reads each K/V block once for the whole group (decode-like shapes have few queries but many
heads per KV head). Key j of the tree is visible to query i iff bit ``j % 32`` of
``tree_mask[b, i, j // 32]``. The CUDA kernel and the Triton slot-order pass: a program owns one
row tile of one KV head of one sequence and walks the prefix keys ``[0, L)`` with no mask but
the length, then the tree keys ``[L, L + T)`` with the ancestor bits, skipping any tree block
that no row of the tile sees (half the blocks of a prefill chain). The Triton ordered passes
(trees, decode steps) walk each row's own key list instead: see
:mod:`~eagle_kernels.ops.attention_triton`.

Split-KV (flash-decoding). When the row tiles of a batch cannot fill the GPU (batch 1 verify:
``ceil(N * group / BLOCK_M) * Hkv`` programs against 132 SMs), each sequence's keys are cut
into splits (a multiple of BLOCK_N; the kernel reads the lengths from the device-side
``cache_lens``: no host sync, graph-capturable); each split writes its partial state to an fp32
workspace and a small second kernel merges them (the Triton ordered passes: always, splits
from the cache capacity, merged in their second pass). The CUDA kernel cuts ``[0, L + T)`` into
``num_splits`` equal chunks, the count chosen on the host from shapes only
(:func:`choose_num_splits`, ``max_len`` standing in for the unknown prefix lengths).

Row invariance: the Triton kernels (:mod:`~eagle_kernels.ops.attention_triton`) give a tree
node's output bit for bit as a decode step's at its position; the CUDA kernel does not (its
splits and tiles depend on N and L).

A row that sees no key (possible only with an empty prefix and a row of zero bits) keeps
``m = -inf, l = 0`` and returns zeros, like the reference; the kernels' ``-inf`` guards exist
for that row and for empty splits.
"""


from __future__ import annotations

import functools
import math

import torch

from . import reference
from ._backend import cpu_extension, cuda_extension, cuda_limit, cuda_stream, register, resolve
from ._triton import triton
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
    if q.numel() == 0:  # no sequence or no query head: nothing to attend (the kernels' grids
        return torch.empty_like(q)  # would be empty, and the Triton launcher divides by Hq)
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


def _workspace(q: torch.Tensor, num_splits: int, state: tuple[int, ...] = (),
               always: bool = False):
    """fp32 partial outputs [B, S, Nq, Hq, D] and per-row split state [B, S, Nq, Hq, *state]
    (the CUDA kernel's base-2 log-sum-exps: state ``()``; the Triton kernels' (max, sum)
    pairs: ``(2,)``); a one-split call gets empty tensors (its kernel writes the output
    directly) unless ``always``."""
    if num_splits == 1 and not always:
        empty = torch.empty(0, dtype=torch.float32, device=q.device)
        return empty, empty
    batch, num_queries, q_heads, head_dim = q.shape
    rows = (batch, num_splits, num_queries, q_heads)
    return (torch.empty(*rows, head_dim, dtype=torch.float32, device=q.device),
            torch.empty(*rows, *state, dtype=torch.float32, device=q.device))


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
    # The kernel reads max_len as stride_kb / stride_kn: the strides of the shape, not the
    # tensor's (is_contiguous() ignores the stride of a size-1 dimension: a [1, L, H, D] view
    # of a longer cache passes it with the longer cache's batch stride). Same addresses.
    stride_kn = kv_heads * head_dim
    cuda_extension().tree_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), cache_lens.data_ptr(),
        tree_mask.data_ptr(), out.data_ptr(), part_o.data_ptr(), part_lse.data_ptr(),
        batch, num_queries, q_heads, kv_heads, head_dim, tree_keys, tree_mask.shape[2],
        q.stride(0), q.stride(1), q.stride(2), max_len * stride_kn, stride_kn, head_dim,
        num_splits, scale, CUDA_DTYPE_CODES[q.dtype], cuda_stream(q.device))
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
register("tree_attention", "cuda", _tree_attention_cuda, auto=False, supports=_cuda_supports)
register("tree_attention", "cpu", _tree_attention_cpu, supports=_cpu_supports)
