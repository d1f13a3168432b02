"""Sort-free target sampling distribution and inverse-CDF sampling: Triton building blocks
(and the CUDA launchers of ``csrc/sampling.cu``, which implement the same algorithm).

The public op :func:`target_probs` (its torch, Triton and CUDA backends are registered here),
and the per-row helpers the
stochastic acceptance kernels (:mod:`eagle_kernels.ops.acceptance`) share. The contract is
:func:`eagle_kernels.ops.reference.target_probs` / :func:`~.reference.sample_from_probs`.

Row statistics (no full-vocabulary sort; one program per row with top-k / top-p, else one per
2048-entry chunk, see below):

* ``m``    the row maximum of ``s = logits / temperature`` (IEEE division, like the reference);
* ``kkey`` the order key of the k-th largest ``s``: a 32-step binary search over the 32-bit
  order keys of fp32 values, each step counting ``s >= mid`` with block reductions. Keeping
  ``key(s) >= kkey`` is the reference's tie-inclusive top-k exactly;
* ``tau``  the smallest ``e = exp(s - m)`` (top-k kept) with ``sum(e' > tau) < top_p * Z_k``: a
  30-step binary search over the bit patterns of non-negative fp32 values (monotone as
  integers). ``e >= tau`` is the reference's keep rule "mass of strictly more probable tokens
  < top_p" (ties kept), evaluated in fp32 instead of fp64;
* ``z``    the sum of ``e`` over the kept set, so ``p(x) = e(x) / z`` on the kept set.

Top-k and top-p passes only run when the parameters ask for them (Python scalars 0 / 1.0 skip
them at compile time; one program per row); without them ``m`` and ``z`` come from each
2048-entry chunk's max and sum, one program per chunk, merged per row. Any token's probability
is then recomputed from its logit in O(1) (:func:`token_prob`), which is what the acceptance
decisions need; :func:`draw_bonus` draws the bonus token by an inverse CDF over chunks (their
residual sums, one program per chunk; then one per sequence picks the chunk and scans it with
``tl.cumsum``). fp32 arithmetic differs
from the reference's fp64 only by rounding: results differ only when a uniform or a top-p mass
falls within rounding of a boundary (the tests check exactly that).
"""

from __future__ import annotations

import math

import torch

from . import reference
from ._backend import cuda_extension, cuda_stream, register, resolve
from ._triton import tl, triton
from ._validate import (FLOAT_DTYPES, check_logits, check_tensor, first_found,
                        value_checks_enabled)


def check_sampling(batch: int, device: torch.device, temperature, top_k, top_p,
                   row_max: torch.Tensor | None = None) -> None:
    """Sampling parameters: Python scalars (checked always: no host sync) or [B] tensors on the
    inputs' device (their values checked where value checks are on). ``row_max``: the logits'
    row maxima from :func:`check_logits` (rows grouped by sequence), to refuse a temperature
    that scales them past float32 (the distribution would be NaN)."""
    specs = (("temperature", temperature, (torch.float32,)),
             ("top_k", top_k, (torch.int32, torch.int64)),
             ("top_p", top_p, (torch.float32,)))
    for name, value, dtypes in specs:
        if isinstance(value, torch.Tensor):
            check_tensor(name, value, dtypes, (batch,), device)
        elif isinstance(value, bool) or not isinstance(
                value, int if name == "top_k" else (int, float)):
            kind = "an int" if name == "top_k" else "a number"
            raise TypeError(f"{name}: expected {kind} or a [B] tensor, got {type(value).__name__}")
        elif isinstance(value, int) and not -2**62 < value < 2**62:  # past int64 / float32
            raise ValueError(f"{name}: expected a value of magnitude below 2**62, got {value}")

    def values(value, neutral):  # a tensor's values are read only where value checks are on
        if isinstance(value, torch.Tensor) and not value_checks_enabled():
            return torch.as_tensor(neutral)
        return torch.as_tensor(value)

    temperature, top_k, top_p = values(temperature, 1.0), values(top_k, 0), values(top_p, 1.0)
    # Written as "not (inside)" so that NaN, which fails every comparison, is refused too.
    bad = ~((temperature > 0) & (temperature < math.inf))
    if bool(bad.any()):
        raise ValueError("temperature: expected a finite value > 0 (use the greedy ops for "
                         f"temperature 0), {first_found(temperature, bad)}")
    bad = top_k < 0
    if bool(bad.any()):
        raise ValueError(f"top_k: expected >= 0 (0 disables top-k), {first_found(top_k, bad)}")
    bad = ~((top_p > 0) & (top_p <= 1))
    if bool(bad.any()):
        raise ValueError("top_p: expected values in (0, 1] (1 disables top-p), "
                         f"{first_found(top_p, bad)}")
    if row_max is not None and row_max.numel():
        if not bool(torch.isfinite(scaled_row_max(row_max, temperature, batch)).all()):
            raise ValueError("temperature: expected one at which logits / temperature stays "
                             "within float32, got one that scales a row's largest logit "
                             f"({float(row_max.abs().max()):.3g}) to +-inf")


def scaled_row_max(row_max: torch.Tensor, temperature: torch.Tensor, batch: int) -> torch.Tensor:
    """The rows' maxima over their sequence's temperature, on row_max's device: a scalar's
    temperature stays a 0-dim host tensor (the one kind torch lets meet a GPU tensor), a [B]
    one is on the inputs' device already."""
    scale = temperature.reshape(-1, 1) if temperature.dim() else temperature
    return row_max.float().reshape(batch, -1) / scale


def target_probs(logits, temperature=1.0, top_k=0, top_p=1.0, backend: str = "auto"):
    """The target sampling distribution [R, V] float32 (see :func:`reference.target_probs`)."""
    check_tensor("logits", logits, FLOAT_DTYPES, (None, None))
    row_max = check_logits("logits", logits)
    check_sampling(logits.shape[0], logits.device, temperature, top_k, top_p, row_max)
    _, implementation = resolve("target_probs", backend, logits.device)
    return implementation(logits, temperature, top_k, top_p)


ONE_BITS = 0x3F800000  # bit pattern of 1.0f: the largest e = exp(s - m)


@triton.jit
def ordered_bits(x):
    """fp32 -> int32 that orders like the float: -0.0 equal to +0.0, every NaN above +inf (the
    key of ``ordered_bits`` in csrc/common.cuh). Integer comparison of keys is float comparison,
    which the top-k search here and the keys of ``topk.order_key`` rely on."""
    bits = tl.where(x == 0.0, 0, x.to(tl.int32, bitcast=True))
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # sign-magnitude -> two's complement order
    return tl.where(x != x, 0x7FFFFFFF, ordered)


@triton.jit
def scaled_logits(row_ptr, offs, vocab, temperature):
    """s = logit / temperature in fp32 with IEEE rounding (-inf outside the row)."""
    x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
    return tl.math.div_rn(x, temperature)


@triton.jit
def _kth_key(row_ptr, vocab, temperature, k, BLOCK: tl.constexpr):
    """Order key of the k-th largest s (1 <= k <= vocab): the largest t with #(key >= t) >= k."""
    lo = tl.full([], -2147483648, tl.int64)
    hi = tl.full([], 2147483647, tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        count = tl.zeros([], tl.int64)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            key = ordered_bits(scaled_logits(row_ptr, offs, vocab, temperature)).to(tl.int64)
            count += tl.sum(((key >= mid) & (offs < vocab)).to(tl.int64), 0)
        lo = tl.where(count >= k, mid, lo)
        hi = tl.where(count >= k, hi, mid - 1)
    return lo.to(tl.int32)


@triton.jit
def _mass_above(row_ptr, vocab, temperature, m, kkey, t, BLOCK: tl.constexpr):
    """Sum of e over top-k-kept tokens with e > t, and over all top-k-kept tokens."""
    above = tl.zeros([], tl.float32)
    total = tl.zeros([], tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        s = scaled_logits(row_ptr, offs, vocab, temperature)
        e = tl.where(ordered_bits(s) >= kkey, tl.exp(s - m), 0.0)
        above += tl.sum(tl.where(e > t, e, 0.0), 0)
        total += tl.sum(e, 0)
    return above, total


@triton.jit
def _top_p_tau(row_ptr, vocab, temperature, m, kkey, top_p, BLOCK: tl.constexpr):
    """Smallest e value tau with mass(e > tau) < top_p * Z_k (searched over fp32 bit patterns)."""
    _, total = _mass_above(row_ptr, vocab, temperature, m, kkey, 2.0, BLOCK)
    budget = top_p * total
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], 0x3F800000, tl.int32)  # mass(e > 1.0) = 0 < budget
    for _ in range(30):
        mid = (lo + hi) // 2
        above, _ = _mass_above(row_ptr, vocab, temperature, m, kkey,
                               mid.to(tl.float32, bitcast=True), BLOCK)
        hi = tl.where(above < budget, mid, hi)
        lo = tl.where(above < budget, lo, mid + 1)
    return lo.to(tl.float32, bitcast=True)


@triton.jit
def _online_max_sum(row_ptr, vocab, temperature, BLOCK: tl.constexpr):
    """Row max of s and sum of exp(s - max) in ONE pass (running per-lane max and rescaled
    sums, as in online softmax): target_probs without top-k / top-p reads each logit once
    here (the acceptance ops take the chunked statistics instead)."""
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        s = tl.math.div_rn(x, temperature)
        new_max = tl.maximum(lane_max, s)
        # -inf - -inf would be NaN: lanes that have seen only -inf subtract 0 (and sum 0)
        pivot = tl.where(new_max == float("-inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp(lane_max - pivot) + tl.exp(s - pivot)
        lane_max = new_max
    m = tl.max(lane_max, 0)  # finite: every row has a finite logit (checked by the op)
    z = tl.sum(lane_sum * tl.exp(lane_max - m), 0)
    return m, z


@triton.jit
def row_stats(row_ptr, vocab, temperature, top_k, top_p, HAS_TOP_K: tl.constexpr,
              HAS_TOP_P: tl.constexpr, BLOCK: tl.constexpr):
    """(m, kkey, tau, z) of one row (see the module docstring)."""
    if not HAS_TOP_K and not HAS_TOP_P:
        m, z = _online_max_sum(row_ptr, vocab, temperature, BLOCK)
        return m, tl.full([], -2147483648, tl.int32), tl.full([], 0.0, tl.float32), z
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        best = tl.maximum(best, tl.math.div_rn(x, temperature))
    m = tl.max(best, 0)
    kkey = tl.full([], -2147483648, tl.int32)
    if HAS_TOP_K:
        if top_k > 0:
            kkey = _kth_key(row_ptr, vocab, temperature, tl.minimum(top_k, vocab), BLOCK)
    tau = tl.full([], 0.0, tl.float32)
    if HAS_TOP_P:
        if top_p < 1.0:
            tau = _top_p_tau(row_ptr, vocab, temperature, m, kkey, top_p, BLOCK)
    z = tl.zeros([], tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z += tl.sum(kept_e(row_ptr, offs, vocab, temperature, m, kkey, tau), 0)
    return m, kkey, tau, z


@triton.jit
def kept_e(row_ptr, offs, vocab, temperature, m, kkey, tau):
    """e = exp(s - m) on the kept set, 0 elsewhere: p = kept_e / z.

    scaled_logits and ordered_bits are written out inline (without the NaN rule: logits are
    checked for NaN): every nested jit call costs the Triton interpreter milliseconds per
    program, and this is the hottest helper."""
    s = tl.math.div_rn(tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
                       .to(tl.float32), temperature)
    bits = tl.where(s == 0.0, 0, s.to(tl.int32, bitcast=True))
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    e = tl.exp(s - m)
    return tl.where((key >= kkey) & (e >= tau) & (offs < vocab), e, 0.0)


@triton.jit
def token_prob(row_ptr, token, vocab, temperature, m, kkey, tau, z):
    """p(token) of one row in O(1) from its stats; 0 for a token outside [0, vocab), which then
    reads nothing (tokens are addresses here: with value checks off nothing else stops them)."""
    token = tl.where((token >= 0) & (token < vocab), token, vocab)  # vocab: masked in kept_e
    return kept_e(row_ptr, token, vocab, temperature, m, kkey, tau) / z


@triton.jit
def _bonus_residual(logits_ptr, draft_ptr, offs, vocab, temperature, m, kkey, tau, z, row,
                    q_row, removed_ptr, num_removed, HAS_Q: tl.constexpr,
                    HAS_REMOVED: tl.constexpr):
    """(residual, p) on a block of one row: p = kept_e / z; the residual is p, minus the draft
    row ``q_row``'s q clamped at 0 when HAS_Q and q_row >= 0, with the ``num_removed`` tokens at
    ``removed_ptr`` zeroed (HAS_REMOVED)."""
    p = kept_e(logits_ptr + row * vocab, offs, vocab, temperature, m, kkey, tau) / z
    r = p
    if HAS_Q:
        has_q = q_row >= 0
        # (a scalar mask and'ed into a block one becomes int32 in the interpreter)
        q = tl.load(draft_ptr + tl.where(has_q, q_row, 0) * vocab + offs,
                    mask=offs < tl.where(has_q, vocab, 0), other=0.0)
        r = tl.where(has_q, tl.maximum(p - q, 0.0), p)
    if HAS_REMOVED:
        # one [CHUNK] compare per removed token (few: the tried siblings)
        for index in range(0, num_removed):
            r = tl.where(offs == tl.load(removed_ptr + index), 0.0, r)
    return r, p


@triton.jit
def _bonus_block(logits_ptr, draft_ptr, m_ptr, kkey_ptr, tau_ptr, z_ptr, temp_ptr, temp, row_ptr,
                 q_row_ptr, removed_ptr, num_removed_ptr, b, offs, vocab, removed_stride,
                 TEMP_PER_ROW: tl.constexpr, HAS_Q: tl.constexpr, HAS_REMOVED: tl.constexpr):
    """(residual, p) of sequence b's bonus row on the block ``offs``: its temperature, row,
    row statistics, q row and removed tokens loaded from the per-sequence arrays."""
    t = temp
    if TEMP_PER_ROW:
        t = tl.load(temp_ptr + b)
    row = tl.load(row_ptr + b)
    q_row = tl.full([], -1, tl.int64)
    if HAS_Q:
        q_row = tl.load(q_row_ptr + b)
    num_removed = 0
    if HAS_REMOVED:
        num_removed = tl.load(num_removed_ptr + b)
    return _bonus_residual(logits_ptr, draft_ptr, offs, vocab, t, tl.load(m_ptr + row),
                           tl.load(kkey_ptr + row), tl.load(tau_ptr + row), tl.load(z_ptr + row),
                           row, q_row, removed_ptr + b * removed_stride, num_removed, HAS_Q,
                           HAS_REMOVED)


@triton.jit
def _bonus_chunk_kernel(logits_ptr, draft_ptr, m_ptr, kkey_ptr, tau_ptr, z_ptr, temp_ptr, temp,
                        row_ptr, q_row_ptr, removed_ptr, num_removed_ptr, sums_ptr, lasts_ptr,
                        vocab, chunks, removed_stride, TEMP_PER_ROW: tl.constexpr,
                        HAS_Q: tl.constexpr, HAS_REMOVED: tl.constexpr, CHUNK: tl.constexpr):
    """Program (b, c): chunk c of sequence b's bonus row: the sums of its residual and of p,
    and the last index where each is positive (-1: none), into [b, c, 0 / 1]."""
    b = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    r, p = _bonus_block(logits_ptr, draft_ptr, m_ptr, kkey_ptr, tau_ptr, z_ptr, temp_ptr, temp,
                        row_ptr, q_row_ptr, removed_ptr, num_removed_ptr, b, offs, vocab,
                        removed_stride, TEMP_PER_ROW, HAS_Q, HAS_REMOVED)
    part = (b * chunks + chunk) * 2
    tl.store(sums_ptr + part, tl.sum(r, 0))
    tl.store(sums_ptr + part + 1, tl.sum(p, 0))
    tl.store(lasts_ptr + part, tl.max(tl.where(r > 0.0, offs, -1), 0))
    tl.store(lasts_ptr + part + 1, tl.max(tl.where(p > 0.0, offs, -1), 0))


@triton.jit
def _bonus_pick_kernel(logits_ptr, draft_ptr, m_ptr, kkey_ptr, tau_ptr, z_ptr, temp_ptr, temp,
                       row_ptr, q_row_ptr, removed_ptr, num_removed_ptr, sums_ptr, lasts_ptr,
                       bonus_u_ptr, num_acc_ptr, out_tokens_ptr, vocab, chunks, removed_stride,
                       width, TEMP_PER_ROW: tl.constexpr, HAS_Q: tl.constexpr,
                       HAS_REMOVED: tl.constexpr, CHUNK: tl.constexpr, CP: tl.constexpr):
    """Program b: the inverse-CDF draw over the chunks' sums (the first chunk whose running sum
    exceeds u * total), then inside that chunk (the first token whose running sum does, strict:
    never a zero-probability token). A residual of total 0 (only reachable through round-off)
    draws from p; past-the-end round-off takes the last positive token of the chunk, or of the
    row when no chunk's running sum exceeds the threshold. Writes out_tokens[b, num_acc[b]]."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, CP)
    present = c < chunks
    part = (b * chunks + c) * 2
    r_sums = tl.load(sums_ptr + part, mask=present, other=0.0)
    use_r = tl.sum(r_sums, 0) > 0.0
    sums = tl.where(use_r, r_sums, tl.load(sums_ptr + part + 1, mask=present, other=0.0))
    threshold = tl.load(bonus_u_ptr + b) * tl.sum(sums, 0)
    crossing = present & (tl.cumsum(sums, 0) > threshold) & (sums > 0.0)
    chosen = tl.min(tl.where(crossing, c, CP), 0)
    row_last = tl.max(tl.load(lasts_ptr + part + tl.where(use_r, 0, 1), mask=present, other=-1),
                      0)
    offs = chosen * CHUNK + tl.arange(0, CHUNK)  # past the row when no chunk crosses: masked
    r, p = _bonus_block(logits_ptr, draft_ptr, m_ptr, kkey_ptr, tau_ptr, z_ptr, temp_ptr, temp,
                        row_ptr, q_row_ptr, removed_ptr, num_removed_ptr, b, offs, vocab,
                        removed_stride, TEMP_PER_ROW, HAS_Q, HAS_REMOVED)
    r = tl.where(use_r, r, p)
    cdf = tl.sum(tl.where(c < chosen, sums, 0.0), 0) + tl.cumsum(r, 0)
    first = tl.min(tl.where((cdf > threshold) & (r > 0.0), offs, 2147483647), 0)
    chunk_last = tl.max(tl.where(r > 0.0, offs, -1), 0)
    token = tl.where(chosen < chunks, tl.where(first < 2147483647, first, chunk_last), row_last)
    tl.store(out_tokens_ptr + b * width + tl.load(num_acc_ptr + b),
             tl.maximum(token, 0).to(tl.int64))


@triton.jit
def _row_params(temp_ptr, temp, top_k_ptr, top_k, top_p_ptr, top_p, index,
                TEMP_PER_ROW: tl.constexpr, TOP_K_PER_ROW: tl.constexpr,
                TOP_P_PER_ROW: tl.constexpr):
    """(temperature, top_k, top_p) of parameter row ``index``: loaded where the parameter is a
    per-row tensor, the scalar otherwise (see :func:`sampling_args`)."""
    t = temp
    if TEMP_PER_ROW:
        t = tl.load(temp_ptr + index)
    k = top_k
    if TOP_K_PER_ROW:
        k = tl.load(top_k_ptr + index)
    p = top_p
    if TOP_P_PER_ROW:
        p = tl.load(top_p_ptr + index)
    return t, k, p


@triton.jit
def _target_probs_kernel(logits_ptr, out_ptr, temp_ptr, temp, top_k_ptr, top_k, top_p_ptr,
                         top_p, vocab, TEMP_PER_ROW: tl.constexpr, TOP_K_PER_ROW: tl.constexpr,
                         TOP_P_PER_ROW: tl.constexpr, HAS_TOP_K: tl.constexpr,
                         HAS_TOP_P: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * vocab
    t, k, p = _row_params(temp_ptr, temp, top_k_ptr, top_k, top_p_ptr, top_p, row,
                          TEMP_PER_ROW, TOP_K_PER_ROW, TOP_P_PER_ROW)
    m, kkey, tau, z = row_stats(row_ptr, vocab, t, k, p, HAS_TOP_K, HAS_TOP_P, BLOCK)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        e = kept_e(row_ptr, offs, vocab, t, m, kkey, tau)
        tl.store(out_ptr + row * vocab + offs, e / z, mask=offs < vocab)


# Vocabulary entries per program of the chunked passes (row statistics without top-k / top-p,
# the bonus draw): one program per chunk and row, so a row costs one chunk's latency, not a
# serial walk over its blocks (~100 us per 32k-row acceptance on the H200, 2026-11-27).
SAMPLING_CHUNK = 2048


def vocab_block(vocab: int) -> int:
    """Elements per block of the vocabulary loops."""
    return min(2048, triton.next_power_of_2(vocab))


def vocab_chunks(vocab: int, most: int = SAMPLING_CHUNK) -> tuple[int, int]:
    """(entries per chunk, chunks) of a vocabulary split into per-program chunks of at most
    ``most`` entries (a power of two)."""
    chunk = min(most, triton.next_power_of_2(vocab))
    return chunk, triton.cdiv(vocab, chunk)


@triton.jit
def chunk_max_sum(x):
    """(max, sum(exp(x - max))) of one chunk of a row; a chunk of only -inf: (-inf, 0)."""
    chunk_max = tl.max(x, 0)
    pivot = tl.where(chunk_max == float("-inf"), 0.0, chunk_max)
    return chunk_max, tl.sum(tl.exp(x - pivot), 0)


@triton.jit
def merged_max_sum(chunk_max, chunk_sum):
    """(max, sum(exp(x - max))) of a row from its chunks' :func:`chunk_max_sum` (padding
    chunks: -inf, 0); a chunk of only -inf adds nothing, said outright rather than left to
    exp(-inf), and a row of only -inf gives (-inf, 0)."""
    row_max = tl.max(chunk_max, 0)
    pivot = tl.where(row_max == float("-inf"), 0.0, row_max)
    return row_max, tl.sum(tl.where(chunk_max == float("-inf"), 0.0,
                                    chunk_sum * tl.exp(chunk_max - pivot)), 0)


def _split(value, cast, dummy: torch.Tensor):
    """(pointer, scalar, per_row) of one parameter: a per-sequence tensor, or a scalar (the
    pointer argument then gets ``dummy``, which the kernel never reads)."""
    if isinstance(value, torch.Tensor):
        return value, cast(0), True
    return dummy, cast(value), False


def temperature_args(temperature, dummy: torch.Tensor) -> dict:
    """Kernel arguments ``temp_ptr``, ``temp``, ``TEMP_PER_ROW`` of the temperature."""
    temp_ptr, temp, temp_rows = _split(temperature, float, dummy)
    return dict(temp_ptr=temp_ptr, temp=temp, TEMP_PER_ROW=temp_rows)


def sampling_args(temperature, top_k, top_p, dummy: torch.Tensor) -> dict:
    """Kernel arguments for the three sampling parameters (scalar or per-sequence tensor).

    A scalar top_k of 0 / top_p of 1.0 compiles the top-k / top-p searches out."""
    k_ptr, k, k_rows = _split(top_k, int, dummy)
    p_ptr, p, p_rows = _split(top_p, float, dummy)
    return dict(**temperature_args(temperature, dummy), top_k_ptr=k_ptr, top_k=k,
                top_p_ptr=p_ptr, top_p=p, TOP_K_PER_ROW=k_rows, TOP_P_PER_ROW=p_rows,
                HAS_TOP_K=k_rows or k > 0, HAS_TOP_P=p_rows or p < 1.0)


def target_probs_triton(logits, temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """Triton backend of ``target_probs``: [R, V] float32 (see the module docstring)."""
    rows, vocab = logits.shape
    out = torch.empty(rows, vocab, dtype=torch.float32, device=logits.device)
    if rows:
        _target_probs_kernel[(rows,)](logits, out, vocab=vocab, BLOCK=vocab_block(vocab),
                                      **sampling_args(temperature, top_k, top_p, logits))
    return out


@triton.jit
def _row_stats_kernel(logits_ptr, m_ptr, kkey_ptr, tau_ptr, z_ptr, temp_ptr, temp, top_k_ptr,
                      top_k, top_p_ptr, top_p, vocab, rows_per_param,
                      TEMP_PER_ROW: tl.constexpr, TOP_K_PER_ROW: tl.constexpr,
                      TOP_P_PER_ROW: tl.constexpr, HAS_TOP_K: tl.constexpr,
                      HAS_TOP_P: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    index = row // rows_per_param  # per-sequence parameters shared by its N node rows
    t, k, p = _row_params(temp_ptr, temp, top_k_ptr, top_k, top_p_ptr, top_p, index,
                          TEMP_PER_ROW, TOP_K_PER_ROW, TOP_P_PER_ROW)
    m, kkey, tau, z = row_stats(logits_ptr + row * vocab, vocab, t, k, p, HAS_TOP_K, HAS_TOP_P,
                                BLOCK)
    tl.store(m_ptr + row, m)
    tl.store(kkey_ptr + row, kkey)
    tl.store(tau_ptr + row, tau)
    tl.store(z_ptr + row, z)


@triton.jit
def _chunk_stats_kernel(logits_ptr, max_ptr, sum_ptr, temp_ptr, temp, vocab, chunks,
                        rows_per_param, TEMP_PER_ROW: tl.constexpr, CHUNK: tl.constexpr):
    """Program (row, c), plain temperature sampling: chunk c's max of s and sum of
    exp(s - max) (0 for a chunk of only -inf) into [row, c]."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    t = temp
    if TEMP_PER_ROW:
        t = tl.load(temp_ptr + row // rows_per_param)
    s = scaled_logits(logits_ptr + row * vocab, chunk * CHUNK + tl.arange(0, CHUNK), vocab, t)
    chunk_max, chunk_sum = chunk_max_sum(s)
    tl.store(max_ptr + row * chunks + chunk, chunk_max)
    tl.store(sum_ptr + row * chunks + chunk, chunk_sum)


@triton.jit
def _merge_stats_kernel(max_ptr, sum_ptr, m_ptr, kkey_ptr, tau_ptr, z_ptr, chunks,
                        CP: tl.constexpr):
    """Program row: (m, kkey, tau, z) of the row from its chunks' (max, sum); no top-k (kkey the
    lowest key) nor top-p (tau 0)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, CP)
    present = c < chunks
    chunk_max = tl.load(max_ptr + row * chunks + c, mask=present, other=float("-inf"))
    chunk_sum = tl.load(sum_ptr + row * chunks + c, mask=present, other=0.0)
    m, z = merged_max_sum(chunk_max, chunk_sum)  # m finite: the op refuses rows of only -inf
    tl.store(m_ptr + row, m)
    tl.store(kkey_ptr + row, -2147483648)
    tl.store(tau_ptr + row, 0.0)
    tl.store(z_ptr + row, z)


def row_stats_triton(logits: torch.Tensor, rows_per_param: int, temperature, top_k, top_p):
    """Stats (m, kkey, tau, z) of every row of [R, V] logits; parameter i covers rows
    [i * rows_per_param, (i + 1) * rows_per_param)."""
    rows, vocab = logits.shape
    device = logits.device
    stats = (torch.empty(rows, dtype=torch.float32, device=device),
             torch.empty(rows, dtype=torch.int32, device=device),
             torch.empty(rows, dtype=torch.float32, device=device),
             torch.empty(rows, dtype=torch.float32, device=device))
    if rows == 0:
        return stats
    args = sampling_args(temperature, top_k, top_p, logits)
    if args["HAS_TOP_K"] or args["HAS_TOP_P"]:  # binary searches over whole rows
        _row_stats_kernel[(rows,)](logits, *stats, vocab=vocab, rows_per_param=rows_per_param,
                                   BLOCK=vocab_block(vocab), **args)
        return stats
    chunk, chunks = vocab_chunks(vocab)
    chunk_max = torch.empty(rows, chunks, dtype=torch.float32, device=device)
    chunk_sum = torch.empty(rows, chunks, dtype=torch.float32, device=device)
    _chunk_stats_kernel[(rows, chunks)](logits, chunk_max, chunk_sum, vocab=vocab, chunks=chunks,
                                        rows_per_param=rows_per_param, CHUNK=chunk,
                                        **temperature_args(temperature, logits))
    _merge_stats_kernel[(rows,)](chunk_max, chunk_sum, *stats, chunks,
                                 CP=triton.next_power_of_2(chunks))
    return stats


def draw_bonus(logits, draft_probs, stats, rows, q_rows, bonus_uniforms, result, temperature,
               removed=None, num_removed=None):
    """Bonus tokens of an acceptance kernel's sequences into ``result.output_tokens[b,
    num_accepted[b]]``: for sequence b, from logits row ``rows[b]`` (of the [B * N, V] rows,
    ``stats`` its row statistics), minus draft row ``q_rows[b]`` of ``draft_probs`` when given
    and >= 0, with ``removed[b, :num_removed[b]]`` zeroed when given. One program per
    2048-entry chunk and sequence sums the residual, then one per sequence draws from the
    chosen chunk."""
    batch, width = result.output_tokens.shape
    vocab = logits.shape[-1]
    chunk, chunks = vocab_chunks(vocab)
    sums = torch.empty(batch, chunks, 2, dtype=torch.float32, device=logits.device)
    lasts = torch.empty(batch, chunks, 2, dtype=torch.int32, device=logits.device)
    has_removed = removed is not None
    common = dict(logits_ptr=logits, draft_ptr=draft_probs if draft_probs is not None else sums,
                  m_ptr=stats[0], kkey_ptr=stats[1], tau_ptr=stats[2], z_ptr=stats[3],
                  row_ptr=rows, q_row_ptr=q_rows if q_rows is not None else rows,
                  removed_ptr=removed if has_removed else rows,
                  num_removed_ptr=num_removed if has_removed else rows, sums_ptr=sums,
                  lasts_ptr=lasts, vocab=vocab, chunks=chunks,
                  removed_stride=removed.shape[1] if has_removed else 0,
                  HAS_Q=q_rows is not None, HAS_REMOVED=has_removed, CHUNK=chunk,
                  **temperature_args(temperature, logits))
    _bonus_chunk_kernel[(batch, chunks)](**common)
    _bonus_pick_kernel[(batch,)](**common, bonus_u_ptr=bonus_uniforms,
                                 num_acc_ptr=result.num_accepted,
                                 out_tokens_ptr=result.output_tokens, width=width,
                                 CP=triton.next_power_of_2(chunks))


# --------------------------------------------------------------------------------------------
# CUDA (csrc/sampling.cu): the same statistics, kernels fed per-row parameter arrays
# --------------------------------------------------------------------------------------------

LOGIT_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def sampling_arrays(temperature, top_k, top_p, count: int, vocab: int, device) -> tuple:
    """[count] float32 / int32 / float32 parameter arrays for the CUDA kernels (top_k clamped
    to the vocabulary, so it fits int32)."""
    def per_row(value, dtype):
        if isinstance(value, torch.Tensor):
            return value.to(device=device, dtype=dtype).contiguous()
        return torch.full((count,), value, dtype=dtype, device=device)

    top_k = top_k.clamp(max=vocab) if isinstance(top_k, torch.Tensor) else min(int(top_k), vocab)
    return (per_row(temperature, torch.float32), per_row(top_k, torch.int32),
            per_row(top_p, torch.float32))


def _target_probs_cuda(logits, temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """CUDA backend of ``target_probs``: [R, V] float32 (one block per row)."""
    rows, vocab = logits.shape
    out = torch.empty(rows, vocab, dtype=torch.float32, device=logits.device)
    if rows:
        params = sampling_arrays(temperature, top_k, top_p, rows, vocab, logits.device)
        cuda_extension().target_probs(
            logits.data_ptr(), out.data_ptr(), *(a.data_ptr() for a in params), rows, vocab,
            LOGIT_DTYPE_CODES[logits.dtype], cuda_stream(logits.device))
    return out


def row_stats_cuda(target_logits, temperature, top_k, top_p) -> tuple:
    """Row stats of every node row of [B, N, V] logits (per-sequence parameters), by the CUDA
    kernel: (temperature [B] float32, [m, kkey, tau, z] each [B * N])."""
    batch, num_nodes, vocab = target_logits.shape
    device = target_logits.device
    params = sampling_arrays(temperature, top_k, top_p, batch, vocab, device)
    rows = batch * num_nodes
    stats = [torch.empty(rows, dtype=dtype, device=device)
             for dtype in (torch.float32, torch.int32, torch.float32, torch.float32)]
    cuda_extension().row_stats(
        target_logits.data_ptr(), *(s.data_ptr() for s in stats),
        *(a.data_ptr() for a in params), rows, vocab, num_nodes,
        LOGIT_DTYPE_CODES[target_logits.dtype], cuda_stream(device))
    return params[0], stats


register("target_probs", "torch", reference.target_probs)
register("target_probs", "cuda", _target_probs_cuda, auto=False)
register("target_probs", "triton", target_probs_triton, auto=False)
