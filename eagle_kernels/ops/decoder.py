"""Decoder-layer ops: linear layers, RMSNorm, SiLU-gated product, rotary embedding.

Public ops with the contracts of the same-named functions in
:mod:`eagle_kernels.ops.reference`. Backends: ``torch`` (the reference: transformers' math on
torch ops) and ``cpu`` (``csrc/cpu/decoder_linear.h``, ``decoder.h``: OpenMP C++ with AVX-512 /
AVX2 / portable code picked at run time; fp32 CPU tensors).

Why a CPU kernel for what torch already has: speed and row invariance. A decode step reads
every weight once, so it is memory-bound: ``linear`` uses the weight where it lies (torch's
[N, K] layout, no copy) and streams it at DRAM speed, where ``nn.Linear`` at 1-16 rows runs
several times slower. And each output row is computed by code that does not depend on how many
rows come with it (fixed lane-wise FMA chain over K, one fixed horizontal sum; threads split
columns, never the reduction), so a token's hidden state is bit-identical whether it is decoded
alone or verified among N tree nodes: greedy speculative decoding is then lossless by
construction. torch's GEMMs give no such guarantee (their blocking follows the row count).
"""

from __future__ import annotations

import math
import os
import warnings
import weakref
from typing import Sequence

import torch

from . import reference
from ._backend import (BACKEND_ENV, VERDICT_ENV, cpu_extension, cpu_float32_only, register,
                       resolve)
from ._validate import block_memo, check_eps, check_range, check_tensor, recall, remember

def _check_input(name: str, x: torch.Tensor, width: int | None = None) -> torch.Tensor:
    check_tensor(name, x, (torch.float16, torch.bfloat16, torch.float32))
    if x.dim() < 1 or (width is not None and x.shape[-1] != width):
        expected = "[..., *]" if width is None else f"[..., {width}]"
        raise ValueError(f"{name}: expected shape {expected}, got {list(x.shape)}")
    return x


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           backend: str = "auto") -> torch.Tensor:
    """``x @ weight.T + bias``, as ``torch.nn.functional.linear``.

    Parameters
    ----------
    x : [..., K] float16 / bfloat16 / float32, contiguous.
    weight : [N, K], dtype and device of ``x``, contiguous (nn.Linear's layout).
    bias : [N], optional.
    backend : "auto", "cpu" (fp32 CPU tensors, row-invariant), "triton" (row-invariant on the
        GPU, :mod:`~eagle_kernels.ops.decoder_triton`) or "torch".

    Returns
    -------
    [..., N], dtype of ``x``. On the cpu backend with quantized activations
    (:func:`set_cpu_activations`), a weight packed in Q4 / Q8 blocks (:func:`pack_weight`) gives
    :func:`~eagle_kernels.ops.reference.linear_quantized_activations` instead.
    """
    return _linear_group(x, [weight], [bias], backend, ("weight", "bias"))[0]


CPU_ACTIVATIONS = {"fp32": 0, "int16": 16, "int8": 8}  # mode -> _cpu.set_activation_bits


def set_cpu_activations(mode: str) -> None:
    """Process-wide: how the cpu backend's GEMMs over Q4 / Q8 block packs (a GGUF target's
    layers and lm_head, :func:`pack_weight`) take x. ``"fp32"`` (default): the fp32 contract
    (``linear``). ``"int16"`` / ``"int8"``: each row of x is first rounded per block of 32 k
    to 16- / 8-bit integers (:func:`~eagle_kernels.ops.reference.quantize_activations`; int8 as
    llama.cpp rounds activations) and multiplied in integers: AVX-512 VNNI + VBMI processors
    run ~4x (int8) / ~2x (int16) more multiply-adds per instruction than fp32 FMAs; others get
    the same bits from a slow scalar fallback. Results then follow
    :func:`~eagle_kernels.ops.reference.linear_quantized_activations`; still row-invariant
    (greedy speculative output equals greedy autoregressive output in every mode, as long as
    it is not changed during a generation). fp32 / bf16 packs (the draft heads) are
    unaffected."""
    if not isinstance(mode, str) or mode not in CPU_ACTIVATIONS:
        raise ValueError(f"mode: expected one of {', '.join(CPU_ACTIVATIONS)}, got {mode!r}")
    try:
        extension = cpu_extension()
    except ImportError as error:
        if mode != "fp32":
            raise RuntimeError(f"set_cpu_activations({mode!r}): the CPU kernels "
                               f"(eagle_kernels._cpu) are not built on this machine") from error
        return
    extension.set_activation_bits(CPU_ACTIVATIONS[mode])


def cpu_activations() -> str:
    """The mode :func:`set_cpu_activations` set ("fp32" where the CPU kernels are not built)."""
    try:
        bits = cpu_extension().activation_bits()
    except ImportError:
        return "fp32"
    return next(mode for mode, value in CPU_ACTIVATIONS.items() if value == bits)


def follows_cpu_activations(weight: torch.Tensor) -> bool:
    """Whether ``linear(x, weight)`` (backend "auto") follows :func:`set_cpu_activations`: an
    fp32 CPU weight whose values are exactly Q4 / Q8 blocks (its pack is a block pack), where
    the cpu backend runs ``linear`` (built, not overridden by ``EAGLE_KERNELS_BACKEND``).
    Packs the weight (kept, as its first ``linear`` call would)."""
    check_tensor("weight", weight, None, (None, None), None)
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.shape[1] == 0:
        return False
    if resolve("linear", "auto", weight.device, dtype=weight.dtype)[0] != "cpu":
        return False
    return _PACKS.get(weight).dtype in (torch.uint8, torch.int8)


def linear_group(x: torch.Tensor, weights: Sequence[torch.Tensor],
                 biases: Sequence[torch.Tensor | None] | None = None,
                 backend: str = "auto") -> tuple[torch.Tensor, ...]:
    """Several linear layers over the same input in one pass (q/k/v, gate/up).

    ``weights[i]`` is [N_i, K]; returns one [..., N_i] tensor per weight. The ``cpu`` backend
    reads ``x`` once and splits all the columns across threads in one parallel region.
    """
    return _linear_group(x, weights, biases, backend)


def _linear_group(x, weights, biases, backend: str, names: tuple[str, str] | None = None):
    """linear_group; ``names``: what errors call the one weight and bias (linear's arguments),
    else ``weights[i]`` / ``biases[i]``."""
    if not isinstance(weights, (list, tuple)) or not weights:
        raise TypeError("weights: expected a non-empty list of [N, K] tensors")
    biases = list(biases) if biases is not None else [None] * len(weights)
    if len(biases) != len(weights):
        raise ValueError(f"biases: expected {len(weights)} entries (one per weight, None for no "
                         f"bias), got {len(biases)}")
    _check_input("x", x)
    width = x.shape[-1]
    implementation = _checked_linear(x, weights, biases, backend, names)
    if width == 0:  # an empty sum, for every backend: the bias, or zeros
        return tuple(torch.zeros(*x.shape[:-1], w.shape[0], dtype=x.dtype, device=x.device)
                     if b is None else b.expand(*x.shape[:-1], -1).clone()
                     for w, b in zip(weights, biases))
    return implementation(x, list(weights), biases)


def _checked_linear(x: torch.Tensor, weights: Sequence[torch.Tensor],
                    biases: Sequence[torch.Tensor | None], backend: str,
                    names: tuple[str, str] | None = None):
    """Check the weights and biases against ``x`` and pick the backend's implementation.
    Inside a :func:`weights_unchanged` block, the same weight and bias objects for the same
    kind of ``x`` (dtype, device, width) and the same backend request were checked and
    resolved already: the answer is kept in the block's memo."""
    memo = block_memo()
    if memo is not None:  # outside a block nothing is kept: no key to build
        # The environment resolve reads (forced backend, the Triton interpreter, GPU verdicts).
        settings = tuple(os.environ.get(name) for name in (BACKEND_ENV, "TRITON_INTERPRET",
                                                           VERDICT_ENV))
        key = ("linear", backend, settings, x.dtype, x.device, x.shape[-1], *map(id, weights),
               *(None if b is None else id(b) for b in biases))
        bound = (*weights, *(b for b in biases if b is not None))
        implementation = recall(memo, key, bound)
        if implementation is not None:
            return implementation
    for i, (w, b) in enumerate(zip(weights, biases)):
        weight_name, bias_name = names or (f"weights[{i}]", f"biases[{i}]")
        check_tensor(weight_name, w, (x.dtype,), (None, x.shape[-1]), x.device)
        if b is not None:
            check_tensor(bias_name, b, (x.dtype,), (w.shape[0],), x.device)
    _, implementation = resolve("linear", backend, x.device, dtype=x.dtype)
    if memo is not None:
        remember(memo, key, bound, implementation)
    return implementation


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, backend: str = "auto"):
    """RMSNorm over the last dimension (transformers' LlamaRMSNorm, fp32 math).

    Parameters
    ----------
    x : [..., H] float16 / bfloat16 / float32, contiguous.
    weight : [H], dtype of ``x``.
    eps : float.
    residual : [..., H], optional. When given, ``h = x + residual`` is normalised and returned
        as well (the next residual stream), saving a separate add.

    Returns
    -------
    ``weight * (h / sqrt(mean(h^2) + eps))`` [..., H], or the pair (that, ``h``) when
    ``residual`` is given.
    """
    _check_input("x", x)
    check_tensor("weight", weight, (x.dtype,), (x.shape[-1],), x.device)
    if residual is not None:
        check_tensor("residual", residual, (x.dtype,), tuple(x.shape), x.device)
    eps = check_eps("eps", eps)
    _, implementation = resolve("rms_norm", backend, x.device, dtype=x.dtype,
                                width=x.shape[-1])
    return implementation(x, weight, eps, residual)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` (the gated MLP's activation), same shapes, dtype of ``gate``."""
    _check_input("gate", gate)
    check_tensor("up", up, (gate.dtype,), tuple(gate.shape), gate.device)
    _, implementation = resolve("silu_mul", backend, gate.device, dtype=gate.dtype)
    return implementation(gate, up)


def check_rope(name: str, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, rotated: int | None = None) -> None:
    """apply_rope's argument checks, ``x`` called ``name`` in the messages; ``rotated``: the
    elements rotated with these tables (``x``'s by default): any at all need a table row."""
    _check_input(name, x)
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"{name}: expected shape [B, T, H, D] with D even, got {list(x.shape)}")
    batch, count, _, dim = x.shape
    check_tensor("positions", positions, (torch.int64,), (batch, count), x.device)
    check_tensor("cos", cos, (x.dtype,), (None, dim), x.device)
    check_tensor("sin", sin, (x.dtype,), tuple(cos.shape), x.device)
    if cos.shape[0] == 0 and (x.numel() if rotated is None else rotated):
        raise ValueError("cos: expected at least one row (the tables positions index)")
    check_range("positions", positions, 0, cos.shape[0], " (rows of the cos/sin tables)")


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               backend: str = "auto") -> torch.Tensor:
    """Rotary embedding of ``x`` at integer ``positions``, from precomputed tables.

    Parameters
    ----------
    x : [B, T, H, D] float, contiguous (D even).
    positions : [B, T] int64, each in ``[0, P)``.
    cos, sin : [P, D] tables in ``x``'s dtype (both halves, as transformers builds them).

    Returns
    -------
    ``x * cos[p] + rotate_half(x) * sin[p]`` [B, T, H, D]: the products are rounded one by one
    (no fused multiply-add) in every backend, so the result is the reference's bit for bit.
    """
    check_rope("x", x, positions, cos, sin)
    _, implementation = resolve("apply_rope", backend, x.device, dtype=x.dtype)
    return implementation(x, positions, cos, sin)


# --------------------------------------------------------------------------------------------
# cpu backend (csrc/cpu/decoder_linear.h, decoder.h; the whole layer's is in layer.py)
# --------------------------------------------------------------------------------------------

PANEL = 16  # columns per packed weight panel (csrc/cpu/decoder_linear.h kPanel)
PACK_BF16_EXACT = True  # pack exactly-bf16 weights in bf16 (see pack_weight; tests compare both)
PACK_Q4_EXACT = True  # pack exactly-Q4_1 weights in 4 bits (see pack_weight)
Q4_BLOCK = 32  # k per Q4_1 block (kernels.h kQ4BlockK)
# A Q4 pack's GEMM multiplies x by the levels q - Q4_ZERO_LEVEL, its offset o = m + Q4_ZERO_LEVEL d
# (kernels.h kQ4ZeroLevel, exported as _cpu.Q4_ZERO_LEVEL and compared in the tests)
Q4_ZERO_LEVEL = 8
PACK_Q8_EXACT = True  # pack exactly-Q8_0 weights in 8 bits (see pack_weight)
RECOVERY_PROBE_ROWS = 64  # rows a Q4 / Q8 recovery tries first, before the whole weight
RECOVERY_CHUNK_ROWS = 4096  # rows recovered at a time (bounds the search's temporaries)
ALL_BYTES_TRUE = 0x0101010101010101  # 8 bool flags, all True, read as one int64
Q4_FORMAT_TAG, Q8_FORMAT_TAG = 2, 3  # kernels.h PackFormat, in the low bits of a pack's address


class _PackedWeights:
    """The cpu GEMM's weight layout, made once per weight and kept while the weight lives.

    ``w`` [N, K] becomes panels [ceil(N / 16), K, 16] (zero-padded): the GEMM then streams each
    panel row by row and keeps every output as one FMA chain over k (see decoder_linear.h). The pack is
    a copy (the original stays what training and the other backends use); it is remade when the
    weight changes in place (version counter) or its storage is replaced, and dropped with the
    weight (weakref callback), so a freed weight's id can never hand back a stale pack.
    """

    def __init__(self):
        self._entries: dict[int, tuple] = {}

    def get(self, w: torch.Tensor) -> torch.Tensor:
        key = id(w)
        stamp = (w.data_ptr(), _version_of(w), tuple(w.shape))
        entry = self._entries.get(key)
        if entry is not None and entry[1] == stamp and stamp[1] is not None:
            return entry[2]
        packed = pack_weight(w)
        if stamp[1] is None:  # an inference tensor has no version: pack per call
            warnings.warn("cpu kernels: a weight is an inference tensor (made under "
                          "torch.inference_mode), so it is re-packed on every call; create "
                          "weights outside inference_mode to keep the pack", stacklevel=3)
        else:
            ref = weakref.ref(w, lambda _, key=key: self._entries.pop(key, None))
            self._entries[key] = (ref, stamp, packed)
        return packed


def _version_of(w: torch.Tensor) -> int | None:
    try:
        return w._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N / 16), K, 16] (fp32 / bf16; Q4 / Q8 packs: see below): panel p holds
    columns 16p..16p+15 of ``w.T``.

    In bfloat16 when every element of ``w`` is exactly a bf16 value (a bf16 checkpoint run in
    fp32, as the bundled EAGLE heads are): the kernel widens the pack exactly, so its results are
    the fp32 pack's bit for bit, from half the bytes (a GEMV streams its weight from DRAM).
    In 4-bit Q4_1 blocks (:func:`pack_q4_exact`, uint8) when every element is exactly a GGUF
    Q4_1 value (the default target's layers, dequantized from its GGUF) and every block's
    offset is exact in fp32: 3/16 of the bytes (its GEMM sums each block in its levels, see
    :func:`pack_q4_exact`: not the fp32 pack's bits, as accurate); in 8-bit Q8_0 blocks
    (:func:`pack_q8_exact`, int8) when every element is exactly a Q8_0 value (its embedding,
    the tied lm_head): 9/32 of the bytes."""
    width = w.shape[1]
    with torch.no_grad():
        if w.dtype == torch.float32:
            packed = pack_q4_exact(w) if PACK_Q4_EXACT else None
            if packed is None and PACK_Q8_EXACT:
                packed = pack_q8_exact(w)
            if packed is not None:
                return packed
        padded = _padded_rows(w)
        packed = padded.view(padded.shape[0] // PANEL, PANEL, width).transpose(1, 2).contiguous()
        if (PACK_BF16_EXACT and w.dtype == torch.float32
                and torch.equal(packed.bfloat16().float(), packed)):
            packed = packed.bfloat16()
    return packed


def _exact_levels(blocks: torch.Tensor, nearest: torch.Tensor, offset: torch.Tensor | float,
                  levels: tuple[int, int]):
    """Per block of ``blocks`` [N, B, 32], the first of the fp16 scale ``nearest`` [N, B, 1]
    (as int16 bits) and its two neighbours for which every element is bit for bit
    ``d * q + offset`` with q an integer in ``levels``, exactly (no rounding: a block pack's GEMM
    works with the exact d q + offset, csrc/cpu/decoder_linear.h "block packs"; d q alone is
    always exact, 11 significant bits times at most 8, but + m may round: such a block is not
    packed); (q float [N, B, 32], d [N, B, 1]) or None if a block has none."""
    q = torch.zeros_like(blocks)
    d = torch.zeros_like(blocks[..., :1])
    found = torch.zeros_like(d, dtype=torch.bool)
    for step in (0, 1, -1):  # the nearest fp16, then its neighbours
        candidate = (nearest + step).view(torch.float16).float()
        safe = torch.where(candidate > 0, candidate, torch.ones_like(candidate))
        level = ((blocks - offset) / safe).round().clamp(*levels)
        rebuilt = candidate * level + offset
        exact = _all_per_block(rebuilt.view(torch.int32) == blocks.view(torch.int32))
        real = candidate.double() * level.double() + torch.as_tensor(offset).double()
        exact &= _all_per_block(real == blocks.double())
        exact &= torch.isfinite(candidate) & ~found
        q = torch.where(exact, level, q)
        d = torch.where(exact, candidate, d)
        found |= exact
        if bool(found.all()):  # as always for a GGUF tensor: the neighbours change nothing
            return q, d
    return None


def _all_per_block(flags: torch.Tensor) -> torch.Tensor:
    """``flags.all(-1, keepdim=True)`` for bool [N, B, 32] (contiguous), 6x faster: read as 4
    int64 words of 8 one-byte flags each (torch's bool reduction over a short last dimension is
    slow; this made a third of the default target's first-call packing)."""
    words = flags.view(torch.int64)
    return (words == ALL_BYTES_TRUE).all(-1, keepdim=True)


def _quant_blocks(w: torch.Tensor) -> torch.Tensor | None:
    """``w`` [N, K] as blocks [N, K / 32, 32], or None when K is no multiple of 32, ``w`` is
    empty or holds a non-finite value."""
    rows, width = w.shape
    if width % Q4_BLOCK or not rows or not torch.isfinite(w).all():
        return None
    return w.reshape(rows, width // Q4_BLOCK, Q4_BLOCK)


def _by_row_chunks(recover, w: torch.Tensor):
    """``recover`` (q4_blocks / q8_blocks) over RECOVERY_CHUNK_ROWS rows at a time, its parts
    concatenated by rows; None if any chunk is not exact."""
    parts = []
    for start in range(0, w.shape[0], RECOVERY_CHUNK_ROWS):
        part = recover(w[start:start + RECOVERY_CHUNK_ROWS])
        if part is None:
            return None
        parts.append(part)
    return tuple(torch.cat(pieces) for pieces in zip(*parts))


def q4_blocks(w: torch.Tensor):
    """(q, d, m) with ``w == d * q + m`` exactly in fp32 for every element of ``w`` [N, K]
    (blocks of 32 consecutive k sharing an fp16 ``d`` and ``m``, ``q`` in 0..15: a GGUF Q4_1
    tensor dequantized to fp32), else None.

    Recovered from the values themselves: a Q4_1 block's smallest element has q = 0, so m is
    the block minimum, and its largest q = 15, so d is the fp16 value nearest (max - m) / 15 or
    one of its two neighbours; every element is then checked exactly. q [N, K] uint8, d and m
    [N, K / 32] float32 (fp16 values)."""
    if w.shape[0] > RECOVERY_PROBE_ROWS and q4_blocks(w[:RECOVERY_PROBE_ROWS]) is None:
        return None  # most weights fail on their first rows: skip the full search
    if w.shape[0] > RECOVERY_CHUNK_ROWS:
        return _by_row_chunks(q4_blocks, w)
    blocks = _quant_blocks(w)
    if blocks is None:
        return None
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    if not torch.equal(low.half().float(), low):
        return None
    found = _exact_levels(blocks, ((high - low) / 15).half().view(torch.int16), low, (0, 15))
    if found is None:
        return None
    q, d = found
    return q.to(torch.uint8).reshape(w.shape), d.squeeze(-1), low.squeeze(-1)


def q8_blocks(w: torch.Tensor):
    """(q, d) with ``w == d * q`` exactly in fp32 for every element of ``w`` [N, K] (blocks of
    32 consecutive k sharing an fp16 ``d``, ``q`` in -128..127: a GGUF Q8_0 tensor dequantized
    to fp32), else None. d is the fp16 value nearest max |w| / 127 or a neighbour; every element
    is checked exactly (-0.0 is not: d * 0 is +0). q [N, K] int8, d [N, K / 32]
    float32 (fp16 values)."""
    if w.shape[0] > RECOVERY_PROBE_ROWS and q8_blocks(w[:RECOVERY_PROBE_ROWS]) is None:
        return None
    if w.shape[0] > RECOVERY_CHUNK_ROWS:
        return _by_row_chunks(q8_blocks, w)
    blocks = _quant_blocks(w)
    if blocks is None:
        return None
    nearest = (blocks.abs().amax(-1, keepdim=True) / 127).half().view(torch.int16)
    found = _exact_levels(blocks, nearest, 0.0, (-128, 127))
    if found is None:
        return None
    q, d = found
    return q.to(torch.int8).reshape(w.shape), d.squeeze(-1)


def pack_q4_exact(w: torch.Tensor) -> torch.Tensor | None:
    """The Q4 pack of ``w`` [N, K] fp32 (csrc/cpu/decoder_linear.h kQ4BlockBytes), or None unless
    every element is exactly ``d * q + m`` of a Q4_1 block, with no rounding (:func:`q4_blocks`),
    and every block's offset ``o = m + 8 d`` is exact in fp32: uint8 [ceil(N / 16), K / 32, 384],
    per panel and block d[16] and o[16] as fp32 bytes, then 16 row pairs of 16 bytes, byte j
    holding column j's q of the pair's even row in its low nibble and of its odd row in its
    high nibble (padding columns: d = o = q = 0, weight 0). The kernel sums each block as
    d * sum(x (q - 8)) + o * sum(x) (decoder_linear.h "block packs"): the weights
    d (q - 8) + o = d q + m, exactly the tensor's. Both hold whenever m and 8 d (and 15 d) are
    within a factor 2^12 of each other's magnitude or one of them is 0 (a Q4_1 quantizer's m is
    its block's minimum and d the block's range / 15, so m is about -7 d for weights centred on
    zero; all 3.3 M blocks of the default target pass); a tensor with one block that does not
    keeps a wider pack (tested)."""
    blocks = q4_blocks(w)
    if blocks is None:
        return None
    q, d, m = blocks
    offset = m + Q4_ZERO_LEVEL * d
    if not torch.equal(offset.double(), m.double() + Q4_ZERO_LEVEL * d.double()):
        return None
    q = _block_panels(q, Q4_BLOCK)  # [P, B, 32, 16]
    pairs = q[..., 0::2, :] | (q[..., 1::2, :] << 4)  # [P, B, 16, 16]: even rows low, odd high
    panels, per_row = q.shape[:2]
    return torch.cat([_scale_bytes(d), _scale_bytes(offset),
                      pairs.reshape(panels, per_row, Q4_BLOCK * PANEL // 2)], dim=-1).contiguous()


def _padded_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` [N, ...] with zero rows appended up to a whole number of panels."""
    rows = t.shape[0]
    out = t.new_zeros(-(-rows // PANEL) * PANEL, *t.shape[1:])
    out[:rows] = t
    return out


def _block_panels(q: torch.Tensor, block: int) -> torch.Tensor:
    """[N, K] per-weight values -> [P, K / block, block, 16]: panel, block, row, column."""
    padded = _padded_rows(q)
    return padded.view(padded.shape[0] // PANEL, PANEL, -1, block).permute(0, 2, 3, 1)


def _scale_bytes(scales: torch.Tensor) -> torch.Tensor:
    """[N, B] fp32 per-block scales -> [P, B, 64] bytes: 16 fp32 per panel and block."""
    padded = _padded_rows(scales)
    panels, per_row = padded.shape[0] // PANEL, padded.shape[1]
    return padded.view(panels, PANEL, per_row).transpose(1, 2).contiguous() \
        .view(torch.uint8).view(panels, per_row, 4 * PANEL)


def pack_q8_exact(w: torch.Tensor) -> torch.Tensor | None:
    """The Q8 pack of ``w`` [N, K] fp32 (csrc/cpu/decoder_linear.h kQ8BlockBytes), or None unless every
    element is exactly a Q8_0 value (:func:`q8_blocks`): int8 [ceil(N / 16), K / 32, 576], per
    panel and block d[16] as fp32 bytes, then 32 rows of 16 int8 q (padding columns: 0)."""
    blocks = q8_blocks(w)
    if blocks is None:
        return None
    q, d = blocks
    q = _block_panels(q, Q4_BLOCK)  # [P, B, 32, 16]
    panels, per_row = q.shape[:2]
    return torch.cat([_scale_bytes(d).view(torch.int8),
                      q.reshape(panels, per_row, Q4_BLOCK * PANEL)], dim=-1).contiguous()


def round_to_q8_0(w: torch.Tensor) -> torch.Tensor | None:
    """``w`` [N, K] fp32 rounded to Q8_0 values (a lossy copy :func:`pack_weight` packs in 8
    bits: 9/32 of the fp32 bytes, 9/16 of bf16). Per block of 32 consecutive k, d is the
    smallest fp16 >= max |w| / 127 (so |w| / d <= 127) and each value the nearest d * q; where
    that d is a subnormal fp16 too coarse for the max to round to q = 127 (the packer recovers d
    from it), d is the largest fp16 below and q is clamped to -127..127 (a block below 2^-24 / 2
    becomes 0). None when K is no multiple of 32, ``w`` holds a non-finite value or a block's
    max |w| / 127 exceeds fp16: keep ``w`` then. For weights whose exact values do not decide the
    output (a draft head's: every draft is checked by the target)."""
    if not isinstance(w, torch.Tensor) or w.dtype != torch.float32:
        raise TypeError(f"w: expected a float32 tensor, got "
                        f"{w.dtype if isinstance(w, torch.Tensor) else type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"w: expected a 2-D [N, K] weight, got shape {tuple(w.shape)}")
    blocks = _quant_blocks(w.detach())
    if blocks is None:
        return None
    largest = blocks.abs().amax(-1, keepdim=True)
    scale = largest / 127
    near = scale.half()  # the fp16 nearest: one of the two neighbours of scale
    bits = near.view(torch.int16)  # non-negative: the next fp16 up / down is bits +- 1
    d_down = torch.where(near.float() <= scale, near, (bits - 1).view(torch.float16)).float()
    d_up = torch.where(near.float() >= scale, near, (bits + 1).view(torch.float16)).float()
    if not torch.isfinite(d_up).all():
        return None
    up_reaches = (largest / torch.where(d_up > 0, d_up, 1.0)).round() == 127
    d = torch.where(up_reaches | (scale == 0), d_up, d_down)
    q = torch.where(d > 0, blocks / torch.where(d > 0, d, 1.0), 0.0).round().clamp(-127, 127)
    rounded = (d * q.to(torch.int8).float()).reshape(w.shape)  # via int8: no -0.0
    return rounded if q8_blocks(rounded) is not None else None


def pack_address(packed: torch.Tensor) -> int:
    """The integer the cpu kernels take for a pack: its address, its low two bits holding the
    format (csrc/cpu/kernels.h ``PackFormat``: 0 fp32, 1 bf16, 2 q4 for a uint8 pack, 3 q8 for
    an int8 pack; packs are 64-byte aligned, so the bits are free)."""
    address = packed.data_ptr()
    if address % 64:
        raise RuntimeError(f"cpu kernels: a packed weight is not 64-byte aligned ({address:#x})")
    if packed.dtype == torch.uint8:
        return address | Q4_FORMAT_TAG
    if packed.dtype == torch.int8:
        return address | Q8_FORMAT_TAG
    return address | int(packed.dtype == torch.bfloat16)


_PACKS = _PackedWeights()


def _rows(x: torch.Tensor) -> int:
    """Rows of x [..., K]: the product of its leading sizes (also when K is 0)."""
    return math.prod(x.shape[:-1])


def _pack_of(w: torch.Tensor, memo: dict | None) -> tuple[torch.Tensor, int]:
    """``w``'s pack and its kernel address; inside a :func:`weights_unchanged` block looked up
    once per weight (the block's memo holds the pack while the weight lives)."""
    kept = recall(memo, ("pack", id(w)), (w,)) if memo is not None else None
    if kept is not None:
        return kept
    packed = _PACKS.get(w)
    address = pack_address(packed)
    if memo is not None and _version_of(w) is not None:  # inference tensors: packed per call
        remember(memo, ("pack", id(w)), (w,), (packed, address))
    return packed, address


def _linear_group_cpu(x, weights, biases):
    rows, width = _rows(x), x.shape[-1]
    outputs, segments, memo = [], [], block_memo()
    packs = [_pack_of(w, memo) for w in weights]  # held until the call returns
    for w, (_, address), b in zip(weights, packs, biases):
        y = torch.empty(*x.shape[:-1], w.shape[0], dtype=x.dtype)
        outputs.append(y)
        segments += [address, 0 if b is None else b.data_ptr(), y.data_ptr(),
                     w.shape[0], w.shape[0]]
    if rows:  # K >= 1: linear_group answers K = 0 itself
        cpu_extension().linear(x.data_ptr(), rows, width, width, segments)
    return tuple(outputs)


def _rms_norm_cpu(x, weight, eps, residual):
    y = torch.empty_like(x)
    total = torch.empty_like(x) if residual is not None else None
    rows, width = _rows(x), x.shape[-1]
    if rows and width:
        cpu_extension().rms_norm(x.data_ptr(), 0 if residual is None else residual.data_ptr(),
                                 0 if total is None else total.data_ptr(), weight.data_ptr(),
                                 y.data_ptr(), rows, width, width, width, eps)
    return y if residual is None else (y, total)


def _silu_mul_cpu(gate, up):
    y = torch.empty_like(gate)
    rows, width = _rows(gate), gate.shape[-1]
    if rows and width:
        cpu_extension().silu_mul(gate.data_ptr(), up.data_ptr(), y.data_ptr(), rows, width, width,
                                 width)
    return y


def _apply_rope_cpu(x, positions, cos, sin):
    out = x.clone()
    batch, count, heads, dim = x.shape
    if out.numel() and cos.shape[0]:
        cpu_extension().rope(out.data_ptr(), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                             batch * count, heads, dim, heads * dim, cos.shape[0])
    return out


for _op, _reference, _cpu in (("linear", reference.linear_group, _linear_group_cpu),
                              ("rms_norm", reference.rms_norm, _rms_norm_cpu),
                              ("silu_mul", reference.silu_mul, _silu_mul_cpu),
                              ("apply_rope", reference.apply_rope, _apply_rope_cpu)):
    register(_op, "torch", _reference)
    register(_op, "cpu", _cpu, supports=cpu_float32_only)
