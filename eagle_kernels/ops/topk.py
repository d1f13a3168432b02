"""Draft-tree growth: fused log-softmax + top-k and EAGLE-2 expansion.

Public ops with the contracts of the same-named functions in :mod:`eagle_kernels.ops.reference`:
:func:`topk_log_softmax`, :func:`eagle2_expand` (the final rerank into a tree,
:func:`~eagle_kernels.ops.tree.eagle2_rerank`, lives with tree construction, as its CUDA kernel
does). All orders are deterministic: best first, equal values by lowest index. Backends:
``torch`` (reference), ``triton`` (below), ``cuda`` (``csrc/topk.cu``) and ``cpu``
(``csrc/cpu/topk.h``, what ``auto`` runs on CPU); the GPU kernels are explicit only until they
have been proven on a GPU.

Ordering keys. Every kernel ranks an fp32 value v at index i by one int64 key,
``ordered(v) << 32 | (2^31 - 1 - i)``: ``ordered`` maps the float bits to an int32 that sorts
like the float (-0.0 folded into 0.0, every NaN above +inf as torch's sort does), the low word
makes the lower index win ties. Keys are unique, so "top k" is k rounds of "take the max key"
(or a rank count) with no tie logic, and every thread/lane order gives the same answer. The
cpu kernels scan a row in index order and compare (value, then index) directly: the same
order, without the key.

Exactness of ``topk_log_softmax``. The reference and the kernels rank by the logit (exact in
fp32 for all three dtypes), not by the rounded log-prob, which could merge two different
logits into one value and so leave their order to accumulation details. Ids therefore match
the reference exactly; log-prob values match to a few ulps (the sum is accumulated in another
order), checked with the flash-attention rule in tests/test_topk_kernels.py.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import cpu_extension, cuda_extension, cuda_limit, cuda_stream, register, resolve
from ._triton import tl, triton
from ._validate import (FLOAT_DTYPES, check_int, check_logits, check_tensor, first_found,
                        nan_or_posinf, value_checks_enabled)
from .sampling import (LOGIT_DTYPE_CODES, chunk_max_sum, merged_max_sum, ordered_bits,
                       vocab_chunks)


def topk_log_softmax(logits, k: int, d2t=None, backend: str = "auto"):
    """Top-k log-probabilities of vocabulary rows.

    Parameters
    ----------
    logits : [R, V] float16 / bfloat16 / float32, contiguous (-inf allowed, not NaN).
    k : int, 1 <= k <= V.
    d2t : [V] int64, optional; draft id i maps to target id ``i + d2t[i]`` (EAGLE-3).
    backend : "auto", "cuda" (k <= ``_C.TOPK_MAX_K``, 32), "triton" (k <= 64), "cpu" or
        "torch".

    Returns
    -------
    log_probs : [R, k] float32, descending.   token_ids : [R, k] int64.
    The reference and the kernels all rank by the logit (see the module docstring), so ids
    match the reference exactly and log-probs to a few ulps.
    """
    check_tensor("logits", logits, FLOAT_DTYPES, (None, None))
    vocab = logits.shape[1]
    check_logits("logits", logits)  # first: an empty vocabulary is the logits' fault, not k's
    check_int("k", k, 1, vocab)
    if d2t is not None:
        check_tensor("d2t", d2t, (torch.int64,), (vocab,), logits.device)
        if value_checks_enabled():
            bad = (torch.arange(vocab, device=d2t.device) + d2t) < 0
            if bool(bad.any()):
                raise ValueError("d2t: draft id + offset must be a non-negative target id, "
                                 f"{first_found(d2t, bad)}")
    _, implementation = resolve("topk_log_softmax", backend, logits.device, k=k)
    return implementation(logits, k, d2t)


def eagle2_expand(frontier_scores, child_log_probs, top_k: int, backend: str = "auto"):
    """One EAGLE-2 expansion step (see :func:`reference.eagle2_expand`).

    Parameters
    ----------
    frontier_scores : [B, K] float32.   child_log_probs : [B, K, C] float32.
    top_k : int, 1 <= top_k <= K * C.
    backend : "auto", "cuda" (K * C <= ``_C.EXPAND_MAX_CANDIDATES``, 6144), "triton", "cpu"
        or "torch"; all bit-exact.

    Returns
    -------
    candidate_scores [B, K*C] float32, next_index [B, top_k] int64, next_scores [B, top_k] float32.
    """
    check_tensor("frontier_scores", frontier_scores, (torch.float32,), (None, None))
    batch, frontier = frontier_scores.shape
    check_tensor("child_log_probs", child_log_probs, (torch.float32,), (batch, frontier, None),
                 frontier_scores.device)
    for name, tensor, what in (("frontier_scores", frontier_scores, "frontier node (dim 1)"),
                               ("child_log_probs", child_log_probs, "child a node (dim 2)")):
        if tensor.shape[-1] == 0:
            raise ValueError(f"{name}: expected at least one {what}, got shape "
                             f"{tuple(tensor.shape)}")
    check_int("top_k", top_k, 1, frontier * child_log_probs.shape[2])
    # +inf is refused with NaN: +inf + -inf makes a NaN score, which would rank first
    if value_checks_enabled():
        bad = torch.stack([nan_or_posinf(frontier_scores).any(),
                           nan_or_posinf(child_log_probs).any()]).tolist()  # one host sync
        for name, found in zip(("frontier_scores", "child_log_probs"), bad):
            if found:
                raise ValueError(f"{name}: expected log-probabilities, <= 0 or -inf, got NaN "
                                 "or +inf")
    _, implementation = resolve("eagle2_expand", backend, frontier_scores.device,
                                candidates=frontier * child_log_probs.shape[2], top_k=top_k)
    return implementation(frontier_scores, child_log_probs, top_k)


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

NO_KEY = tl.constexpr(-9223372036854775807)  # below every real key (constexpr: used in @jit)
# Vocabulary entries per program of topk_log_softmax's first pass. One program per chunk and
# row: a single program walking a 32k row chunk by chunk spent ~60 us on the H200 (2026-11-27),
# almost all of it in the serial K-round merges of each chunk into the running best.
TOPK_CHUNK = 2048
# Largest k of the Triton top-k: its merge holds [chunks, k] int64 keys in one program (at a
# 152k vocabulary and k = 64, 8192 keys) and takes k serial reductions over them.
TOPK_TRITON_MAX_K = 64


@triton.jit
def order_key(values, index):
    """int64 key: larger value first, then lower index (see the module docstring)."""
    return (ordered_bits(values).to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def key_index(keys):
    """Index encoded in the low word of :func:`order_key` keys."""
    return 0x7FFFFFFF - keys.to(tl.int32)


@triton.jit
def _take_top(keys, K: tl.constexpr, KP: tl.constexpr):
    """The K largest of a set of unique keys, best first ([KP]; slots >= K: NO_KEY)."""
    slots = tl.arange(0, KP)
    top = tl.full([KP], NO_KEY, tl.int64)
    for j in range(K):
        best = tl.max(keys, 0)
        top = tl.where(slots == j, best, top)
        keys = tl.where(keys == best, NO_KEY, keys)
    return top


@triton.jit
def _topk_chunk_kernel(logits_ptr, keys_ptr, max_ptr, sum_ptr, vocab, chunks,
                       K: tl.constexpr, KP: tl.constexpr, CHUNK: tl.constexpr):
    """Program (row, c): chunk c of the row: its K best keys, its max and sum(exp(x - max))
    (0 for a chunk of only -inf) into the workspace at [row, c]."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    index = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = index < vocab
    x = tl.load(logits_ptr + row * vocab + index, mask=inside,
                other=float("-inf")).to(tl.float32)
    chunk_max, chunk_sum = chunk_max_sum(x)
    part = row * chunks + chunk
    tl.store(max_ptr + part, chunk_max)
    tl.store(sum_ptr + part, chunk_sum)
    slots = tl.arange(0, KP)
    top = _take_top(tl.where(inside, order_key(x, index), NO_KEY), K, KP)
    tl.store(keys_ptr + part * K + slots, top, mask=slots < K)


@triton.jit
def _topk_merge_kernel(logits_ptr, d2t_ptr, keys_ptr, max_ptr, sum_ptr, values_ptr, ids_ptr,
                       vocab, chunks, K: tl.constexpr, KP: tl.constexpr,
                       CP: tl.constexpr, HAS_D2T: tl.constexpr):
    """Program row: the K best of its chunks' keys (keys are unique, so the best K of the
    chunks' best K are the row's), the row's log-sum-exp from the chunks' (max, sum), then the
    K winners' logits re-read to form their log-probs."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.arange(0, CP)
    slots = tl.arange(0, KP)
    present = chunk < chunks
    part = row * chunks + chunk
    keys = tl.load(keys_ptr + part[:, None] * K + slots[None, :],
                   mask=present[:, None] & (slots < K)[None, :], other=NO_KEY)
    top = _take_top(tl.reshape(keys, [CP * KP]), K, KP)
    row_max, row_sum = merged_max_sum(tl.load(max_ptr + part, mask=present,
                                              other=float("-inf")),
                                      tl.load(sum_ptr + part, mask=present, other=0.0))
    taken = slots < K
    ids = tl.where(taken, key_index(top), 0)
    x = tl.load(logits_ptr + row * vocab + ids, mask=taken, other=0.0).to(tl.float32)
    # torch's order of operations: (x - max) - log(sum)
    log_probs = (x - row_max) - tl.log(row_sum)
    out_ids = ids.to(tl.int64)
    if HAS_D2T:
        out_ids += tl.load(d2t_ptr + out_ids, mask=taken, other=0)
    tl.store(values_ptr + row * K + slots, log_probs, mask=taken)
    tl.store(ids_ptr + row * K + slots, out_ids, mask=taken)


def _topk_log_softmax_triton(logits, k, d2t):
    rows, vocab = logits.shape
    device = logits.device
    values = torch.empty(rows, k, dtype=torch.float32, device=device)
    ids = torch.empty(rows, k, dtype=torch.int64, device=device)
    if rows == 0:
        return values, ids
    chunk, chunks = vocab_chunks(vocab, TOPK_CHUNK)
    keys = torch.empty(rows, chunks, k, dtype=torch.int64, device=device)
    chunk_max = torch.empty(rows, chunks, dtype=torch.float32, device=device)
    chunk_sum = torch.empty(rows, chunks, dtype=torch.float32, device=device)
    kp = triton.next_power_of_2(k)
    _topk_chunk_kernel[(rows, chunks)](logits, keys, chunk_max, chunk_sum, vocab, chunks, K=k,
                                       KP=kp, CHUNK=chunk)
    _topk_merge_kernel[(rows,)](logits, d2t if d2t is not None else ids, keys, chunk_max,
                                chunk_sum, values, ids, vocab, chunks, K=k, KP=kp,
                                CP=triton.next_power_of_2(chunks), HAS_D2T=d2t is not None)
    return values, ids


@triton.jit
def _expand_kernel(frontier_ptr, child_ptr, candidate_ptr, next_index_ptr, next_scores_ptr,
                   frontier, children, TOP: tl.constexpr, BLOCK: tl.constexpr,
                   RB: tl.constexpr):
    """One program per tree: all K*C keys in registers; each candidate counts the keys above
    it ([RB, K*C] compare tiles) and, when that rank is < TOP, writes itself to that slot."""
    tree = tl.program_id(0).to(tl.int64)
    count = frontier * children
    frontier_ptr += tree * frontier
    child_ptr += tree * count
    index = tl.arange(0, BLOCK)
    inside = index < count
    scores = (tl.load(frontier_ptr + index // children, mask=inside)
              + tl.load(child_ptr + index, mask=inside))  # one fp32 add, as in the reference
    tl.store(candidate_ptr + tree * count + index, scores, mask=inside)
    all_keys = tl.where(inside, order_key(scores, index), NO_KEY)
    for start in range(0, count, RB):
        mine = start + tl.arange(0, RB)
        mine_inside = mine < count
        my_scores = (tl.load(frontier_ptr + mine // children, mask=mine_inside)
                     + tl.load(child_ptr + mine, mask=mine_inside))
        rank = tl.sum((all_keys[None, :] > order_key(my_scores, mine)[:, None]).to(tl.int32), 1)
        wins = mine_inside & (rank < TOP)
        tl.store(next_index_ptr + tree * TOP + rank, mine.to(tl.int64), mask=wins)
        tl.store(next_scores_ptr + tree * TOP + rank, my_scores, mask=wins)


def rank_rows(block: int) -> int:
    """Rows of an [rows, block] rank-compare tile: about 16k compares per step."""
    return max(1, min(block, 16384 // block))


def _expand_outputs(batch: int, candidates: int, top_k: int, device):
    """Uninitialised (candidate_scores, next_index, next_scores) that an expand kernel fills."""
    return (torch.empty(batch, candidates, dtype=torch.float32, device=device),
            torch.empty(batch, top_k, dtype=torch.int64, device=device),
            torch.empty(batch, top_k, dtype=torch.float32, device=device))


def _eagle2_expand_triton(frontier_scores, child_log_probs, top_k):
    batch, frontier, children = child_log_probs.shape
    candidate, next_index, next_scores = _expand_outputs(batch, frontier * children, top_k,
                                                         frontier_scores.device)
    if batch > 0:
        block = triton.next_power_of_2(frontier * children)
        _expand_kernel[(batch,)](frontier_scores, child_log_probs, candidate, next_index,
                                 next_scores, frontier, children, TOP=top_k, BLOCK=block,
                                 RB=rank_rows(block))
    return candidate, next_index, next_scores


register("topk_log_softmax", "torch", reference.topk_log_softmax)
register("eagle2_expand", "torch", reference.eagle2_expand)
# --------------------------------------------------------------------------------------------
# CUDA kernels (csrc/topk.cu, csrc/tree.cu): raw pointers, sizes and the current stream
# --------------------------------------------------------------------------------------------

def _topk_cuda_supports(k, **_) -> str | None:
    most = cuda_limit("TOPK_MAX_K")  # per-thread list length of csrc/topk.cu
    return f"k: expected k <= {most} (_C.TOPK_MAX_K), got {k}" if most and k > most else None


def _expand_cuda_supports(candidates, **_) -> str | None:
    most = cuda_limit("EXPAND_MAX_CANDIDATES")  # int64 keys of all K * C in shared memory
    if most and candidates > most:
        return (f"child_log_probs: expected K * C <= {most} (_C.EXPAND_MAX_CANDIDATES), got "
                f"{candidates}")
    return None


def _topk_log_softmax_cuda(logits, k, d2t):
    rows, vocab = logits.shape
    values = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(rows, k, dtype=torch.int64, device=logits.device)
    cuda_extension().topk_log_softmax(
        logits.data_ptr(), LOGIT_DTYPE_CODES[logits.dtype], 0 if d2t is None else d2t.data_ptr(),
        values.data_ptr(), ids.data_ptr(), rows, vocab, k, cuda_stream(logits.device))
    return values, ids


def _eagle2_expand_cuda(frontier_scores, child_log_probs, top_k):
    batch, frontier, children = child_log_probs.shape
    candidate, next_index, next_scores = _expand_outputs(batch, frontier * children, top_k,
                                                         frontier_scores.device)
    cuda_extension().eagle2_expand(
        frontier_scores.data_ptr(), child_log_probs.data_ptr(), candidate.data_ptr(),
        next_index.data_ptr(), next_scores.data_ptr(), batch, frontier, children, top_k,
        cuda_stream(frontier_scores.device))
    return candidate, next_index, next_scores


# --------------------------------------------------------------------------------------------
# CPU kernels (csrc/cpu/topk.h): the drafting step's top-k on CPU, OpenMP over rows
# --------------------------------------------------------------------------------------------

def cpu_select_supports(count: int, name: str) -> str | None:
    """Why the cpu kernels cannot keep the ``count`` best (their limit, csrc/cpu/kernels.h
    kSelectMaxK), or None."""
    most = cpu_extension().SELECT_MAX_K
    return f"{name}: expected <= {most} (_cpu.SELECT_MAX_K), got {count}" if count > most else None


def _topk_log_softmax_cpu(logits, k, d2t):
    rows, vocab = logits.shape
    logits = logits.float().contiguous()  # fp16 / bf16 upcast exactly: the same ranks
    values = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(rows, k, dtype=torch.int64, device=logits.device)
    cpu_extension().topk_log_softmax(logits.data_ptr(), 0 if d2t is None else d2t.data_ptr(),
                                     values.data_ptr(), ids.data_ptr(), rows, vocab, k)
    return values, ids


def _eagle2_expand_cpu(frontier_scores, child_log_probs, top_k):
    batch, frontier, children = child_log_probs.shape
    candidate, next_index, next_scores = _expand_outputs(batch, frontier * children, top_k,
                                                         frontier_scores.device)
    cpu_extension().eagle2_expand(
        frontier_scores.data_ptr(), child_log_probs.data_ptr(), candidate.data_ptr(),
        next_index.data_ptr(), next_scores.data_ptr(), batch, frontier, children, top_k)
    return candidate, next_index, next_scores


register("topk_log_softmax", "cpu", _topk_log_softmax_cpu,
         supports=lambda k=1, **_: cpu_select_supports(k, "k"))
register("eagle2_expand", "cpu", _eagle2_expand_cpu,
         supports=lambda top_k=1, **_: cpu_select_supports(top_k, "top_k"))
def _topk_triton_supports(k, **_) -> str | None:
    if k > TOPK_TRITON_MAX_K:
        return f"k: expected k <= {TOPK_TRITON_MAX_K} (topk.TOPK_TRITON_MAX_K), got {k}"
    return None


register("topk_log_softmax", "triton", _topk_log_softmax_triton, auto=False,
         supports=_topk_triton_supports)
register("eagle2_expand", "triton", _eagle2_expand_triton, auto=False)
register("topk_log_softmax", "cuda", _topk_log_softmax_cuda, auto=False,
         supports=_topk_cuda_supports)
register("eagle2_expand", "cuda", _eagle2_expand_cuda, auto=False,
         supports=_expand_cuda_supports)
