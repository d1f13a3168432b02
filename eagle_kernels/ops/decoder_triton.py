"""Triton backends of the decoder's ``linear`` and ``rms_norm`` (row-invariant on the GPU), and
of ``apply_rope`` and ``silu_mul`` (one launch each; elementwise, so row-invariant anyway).

Contracts: :func:`eagle_kernels.ops.linear_group` and :func:`eagle_kernels.ops.rms_norm` (the
torch reference ops). Why they exist: cuBLAS and torch's reductions choose their kernels, tiles
and split counts from the row count M, so a token's projections and norms change in the last
bits with how many tokens are computed with it, and a verify pass over N tree nodes then does
not give a decode step's logits. These kernels compute every output row with code that depends
only on the weight's shape and the device, never on M (with the Triton tree attention, which
visits each row's keys in list order), so greedy speculative decoding is lossless by
construction on the GPU as it is on the CPU backend.

linear: ``y = x @ W.T + b`` in tiles of LINEAR_BLOCK_M x LINEAR_BLOCK_N outputs with fp32
accumulation over K in LINEAR_BLOCK_K steps, one tile shape for every M. When the column tiles
cannot fill the GPU (decode: M = 1), K is cut into a split count chosen from (N, K, SM count)
only; the splits' fp32 partial sums are added in split order by a second kernel, which adds
the bias and rounds. Weights are read in nn.Linear's [N, K] layout, no repacking. A group
(q / k / v, gate / up) runs as one launch of both kernels, each weight's tiles computed as a
launch of that weight alone would (its own split count), so grouping never changes a bit.

rms_norm: one program per row, the whole row in one block of BLOCK >= H lanes: the sum of
squares is one fixed reduction per row. fp32 math as transformers' LlamaRMSNorm.
"""

from __future__ import annotations

import math

import torch

from ._backend import register
from ._triton import tl, triton
from .attention import _sm_count
from .attention_triton import EXACT_ROUNDING, _cast, _mma, dot_precision, interpreter_upcast

# Rows per tile, whatever M: a row's MMAs are the same in every call. 64 (wgmma tiles on sm_90):
# on the H200 (bench/results/2026-11-27_nvidia-h200, bench_decoder.csv, Llama-3.1-8B weights)
# within -5..+3 % of 16 rows at M 1-16 and 1.2-2.4x faster at M 60-240 (lm_head at 60 rows
# 262 against 507 us; cuBLAS 280).
LINEAR_BLOCK_M = 64
LINEAR_BLOCK_N = 64
LINEAR_BLOCK_K = 64
LINEAR_MIN_SPLIT_BLOCKS = 4  # K blocks per split at least: a split's partial costs a round trip
LINEAR_SUM_BLOCK = 1024  # outputs per program of the K-split sum
# Weights in one launch (q / k / v; gate / up): the kernels' argument slots, not a tuning knob.
# Launches look like most of a GPU decode step: the H200's AR steps cost ~97 us per layer at
# both model shapes against ~40 launches per layer then, counted on the CPU
# (bench/results/2026-11-27_nvidia-h200; an inference, not a measurement).
LINEAR_GROUP_MAX = 3
RMS_NORM_MAX_WIDTH = 16384  # one row in registers
ROPE_BLOCK_ELEMENTS = 4096  # head elements per RoPE program at most


@triton.jit
def _linear_tile(x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, rows, cols, width, split_blocks,
                 tile_m, tile_n, split, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One output tile (row tile, column tile, K split) of one weight: x [M, K] and w [N, K]
    contiguous; writes out [M, N] (bias added, rounded) or, when SPLIT, the split's fp32
    partial [S, M, N]."""
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rm < rows
    col_ok = rn < cols
    k_start = split * split_blocks * BLOCK_K
    k_end = tl.minimum(k_start + split_blocks * BLOCK_K, width)
    steps = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * width
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * width
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        kk = k + steps
        k_ok = kk < k_end
        a = tl.load(x_rows + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += _mma(a, tl.trans(w), DOT_PRECISION, UPCAST)
    out_mask = row_ok[:, None] & col_ok[None, :]
    offsets = rm.to(tl.int64)[:, None] * cols + rn[None, :]
    if SPLIT:
        tl.store(part_ptr + split.to(tl.int64) * rows * cols + offsets, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offsets, _cast(acc, out_ptr.dtype.element_ty, UPCAST), mask=out_mask)


@triton.jit
def _linear_kernel(x_ptr, rows, width,
                   w0_ptr, bias0_ptr, out0_ptr, part0_ptr, cols0, split_blocks0, splits0,
                   w1_ptr, bias1_ptr, out1_ptr, part1_ptr, cols1, split_blocks1, splits1,
                   w2_ptr, bias2_ptr, out2_ptr, part2_ptr, cols2, split_blocks2, splits2,
                   WEIGHTS: tl.constexpr, HAS_BIAS0: tl.constexpr, SPLIT0: tl.constexpr,
                   HAS_BIAS1: tl.constexpr, SPLIT1: tl.constexpr, HAS_BIAS2: tl.constexpr,
                   SPLIT2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Program (row tile, column tile over the group's weights in order, K split): one launch
    for up to LINEAR_GROUP_MAX weights over the same x (q / k / v, gate / up). Weight i's
    arguments end in i; weights past WEIGHTS are never read. A tile computes exactly what a
    launch of its weight alone computes (its own split count; programs past it do nothing)."""
    tile_m = tl.program_id(0)
    tile_n = tl.program_id(1)
    split = tl.program_id(2)
    tiles0 = (cols0 - 1) // BLOCK_N + 1  # not tl.cdiv: cols + BLOCK_N - 1 can pass 2^31
    if tile_n < tiles0:
        if split < splits0:
            _linear_tile(x_ptr, w0_ptr, bias0_ptr, out0_ptr, part0_ptr, rows, cols0, width,
                         split_blocks0, tile_m, tile_n, split, HAS_BIAS0, SPLIT0, BLOCK_M,
                         BLOCK_N, BLOCK_K, DOT_PRECISION, UPCAST)
    elif WEIGHTS > 1:
        tile_n1 = tile_n - tiles0
        tiles1 = (cols1 - 1) // BLOCK_N + 1
        if tile_n1 < tiles1:
            if split < splits1:
                _linear_tile(x_ptr, w1_ptr, bias1_ptr, out1_ptr, part1_ptr, rows, cols1, width,
                             split_blocks1, tile_m, tile_n1, split, HAS_BIAS1, SPLIT1, BLOCK_M,
                             BLOCK_N, BLOCK_K, DOT_PRECISION, UPCAST)
        elif WEIGHTS > 2:
            if split < splits2:
                _linear_tile(x_ptr, w2_ptr, bias2_ptr, out2_ptr, part2_ptr, rows, cols2, width,
                             split_blocks2, tile_m, tile_n1 - tiles1, split, HAS_BIAS2, SPLIT2,
                             BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, UPCAST)


@triton.jit
def _sum_splits_block(part_ptr, bias_ptr, out_ptr, count, cols, num_splits, block_index,
                      HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr):
    """out[i] = sum over splits s in order of part[s, i] (+ bias[i % cols]) for block
    ``block_index`` of i < count = M * N."""
    i = block_index.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < count
    parts = part_ptr + i  # 64-bit pointers: split * count can pass 2^31
    total = tl.load(parts, mask=ok, other=0.0)
    for _ in range(1, num_splits):
        parts += count
        total += tl.load(parts, mask=ok, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + i % cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + i, _cast(total, out_ptr.dtype.element_ty, UPCAST), mask=ok)


@triton.jit
def _sum_splits_kernel(part0_ptr, bias0_ptr, out0_ptr, count0, cols0, splits0,
                       part1_ptr, bias1_ptr, out1_ptr, count1, cols1, splits1,
                       part2_ptr, bias2_ptr, out2_ptr, count2, cols2, splits2,
                       WEIGHTS: tl.constexpr, HAS_BIAS0: tl.constexpr, HAS_BIAS1: tl.constexpr,
                       HAS_BIAS2: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr):
    """The split sums of up to LINEAR_GROUP_MAX split weights in one launch, their blocks in
    weight order (arguments ending in i: weight i, as in _linear_kernel)."""
    block = tl.program_id(0)
    blocks0 = (count0 - 1) // BLOCK + 1  # not tl.cdiv: count + BLOCK - 1 can pass 2^31
    if block < blocks0:
        _sum_splits_block(part0_ptr, bias0_ptr, out0_ptr, count0, cols0, splits0, block,
                          HAS_BIAS0, BLOCK, UPCAST)
    elif WEIGHTS > 1:
        block1 = block - blocks0
        blocks1 = (count1 - 1) // BLOCK + 1
        if block1 < blocks1:
            _sum_splits_block(part1_ptr, bias1_ptr, out1_ptr, count1, cols1, splits1, block1,
                              HAS_BIAS1, BLOCK, UPCAST)
        elif WEIGHTS > 2:
            _sum_splits_block(part2_ptr, bias2_ptr, out2_ptr, count2, cols2, splits2,
                              block1 - blocks1, HAS_BIAS2, BLOCK, UPCAST)


def linear_splits(cols: int, width: int, device: torch.device) -> int:
    """K splits of a [cols, width] weight: enough programs for about two waves of the GPU when
    only the column tiles run (one row tile), each split at least LINEAR_MIN_SPLIT_BLOCKS K
    blocks. From the weight's shape and the device only (row invariance)."""
    col_tiles = triton.cdiv(cols, LINEAR_BLOCK_N)
    k_blocks = triton.cdiv(width, LINEAR_BLOCK_K)
    wanted = triton.cdiv(2 * _sm_count(device), col_tiles)
    return max(1, min(wanted, k_blocks // LINEAR_MIN_SPLIT_BLOCKS))


def _weight_launch(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   out: torch.Tensor):
    """One weight's part of a grouped launch: (_linear_kernel's arguments for it, its
    constexpr flags, its split-sum arguments or None). From the weight's shape and the device
    only, as for a launch of the weight alone: same split count, same bits."""
    rows, width = x2d.shape  # rows, width >= 1: linear_group answers K = 0 itself
    cols = weight.shape[0]
    k_blocks = triton.cdiv(width, LINEAR_BLOCK_K)
    split_blocks = triton.cdiv(k_blocks, linear_splits(cols, width, x2d.device))
    splits = triton.cdiv(k_blocks, split_blocks)  # none left empty
    part = (torch.empty(splits, rows, cols, dtype=torch.float32, device=x2d.device)
            if splits > 1 else out)
    bias_arg = bias if bias is not None else out  # never read without HAS_BIAS
    tile_args = (weight, bias_arg, out, part, cols, split_blocks, splits)
    sum_args = (part, bias_arg, out, rows * cols, cols, splits) if splits > 1 else None
    return tile_args, (bias is not None, splits > 1), sum_args


def _padded(parts: list, fill) -> list:
    """``parts`` filled up to LINEAR_GROUP_MAX entries with ``fill`` (arguments of slots a
    launch never reads)."""
    return parts + [fill] * (LINEAR_GROUP_MAX - len(parts))


def _linear_launch(x2d: torch.Tensor, group: list) -> None:
    """One _linear_kernel launch (and at most one split-sum launch) for ``group``: 1 to
    LINEAR_GROUP_MAX (weight, bias or None, out [M, N_i]) of nonzero size over x2d [M, K].
    The grid's second dimension holds the group's column tiles together (CUDA allows 65535:
    4.19 M columns, far above any model's q / k / v)."""
    rows = x2d.shape[0]
    launches = [_weight_launch(x2d, *member) for member in group]
    tile_args = [arg for tiles, _, _ in _padded(launches, launches[0]) for arg in tiles]
    flags = {}
    for i, (has_bias, split) in enumerate(_padded([f for _, f, _ in launches], (False, False))):
        flags[f"HAS_BIAS{i}"], flags[f"SPLIT{i}"] = has_bias, split
    upcast = interpreter_upcast(x2d)
    col_tiles = sum(triton.cdiv(w.shape[0], LINEAR_BLOCK_N) for w, _, _ in group)
    splits = max(tiles[-1] for tiles, _, _ in launches)
    grid = (triton.cdiv(rows, LINEAR_BLOCK_M), col_tiles, splits)
    _linear_kernel[grid](
        x2d, rows, x2d.shape[1], *tile_args, WEIGHTS=len(group), **flags,
        BLOCK_M=LINEAR_BLOCK_M, BLOCK_N=LINEAR_BLOCK_N, BLOCK_K=LINEAR_BLOCK_K,
        DOT_PRECISION=dot_precision(x2d), UPCAST=upcast, num_warps=4)
    sums = [(args, flag[0]) for _, flag, args in launches if args is not None]
    if sums:
        sum_args = [arg for args, _ in _padded(sums, sums[0]) for arg in args]
        biased = {f"HAS_BIAS{i}": has_bias
                  for i, (_, has_bias) in enumerate(_padded(sums, (None, False)))}
        blocks = sum(triton.cdiv(args[3], LINEAR_SUM_BLOCK) for args, _ in sums)
        _sum_splits_kernel[(blocks,)](*sum_args, WEIGHTS=len(sums), **biased,
                                      BLOCK=LINEAR_SUM_BLOCK, UPCAST=upcast)


def _linear_group_triton(x, weights, biases):
    """Triton backend of linear_group (checked arguments: x [..., K] contiguous, weights [N_i,
    K] of x's dtype and device): one launch per LINEAR_GROUP_MAX weights (plus one for their
    K-split sums), the same bits as one launch per weight."""
    rows = math.prod(x.shape[:-1])
    x2d = x.reshape(rows, x.shape[-1])
    outputs, group = [], []
    for w, b in zip(weights, biases):
        out = torch.empty(*x.shape[:-1], w.shape[0], dtype=x.dtype, device=x.device)
        outputs.append(out)
        if rows and w.shape[0]:
            group.append((w.contiguous(), b, out.view(rows, w.shape[0])))
    for start in range(0, len(group), LINEAR_GROUP_MAX):
        _linear_launch(x2d, group[start:start + LINEAR_GROUP_MAX])
    return tuple(outputs)


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, total_ptr, width, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr):
    """Program per row: h = x (+ residual, rounded to x's dtype and stored), out = weight *
    (h * rsqrt(mean(h^2) + eps)) rounded to x's dtype before the weight, as the reference."""
    row = tl.program_id(0).to(tl.int64) * width
    cols = tl.arange(0, BLOCK)
    ok = cols < width
    h = tl.load(x_ptr + row + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        h = _cast(h.to(tl.float32) + tl.load(residual_ptr + row + cols, mask=ok,
                                             other=0.0).to(tl.float32),
                  x_ptr.dtype.element_ty, UPCAST)
        tl.store(total_ptr + row + cols, h, mask=ok)
    hf = h.to(tl.float32)
    normed = hf * tl.rsqrt(tl.sum(hf * hf, 0) / width + eps)
    normed = _cast(normed, x_ptr.dtype.element_ty, UPCAST).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row + cols, _cast(weight * normed, out_ptr.dtype.element_ty, UPCAST),
             mask=ok)


def _rms_norm_triton(x, weight, eps, residual):
    """Triton backend of rms_norm (checked arguments, x and residual contiguous)."""
    width = x.shape[-1]
    out = torch.empty_like(x)
    total = torch.empty_like(x) if residual is not None else None
    rows = math.prod(x.shape[:-1])
    if rows and width:
        _rms_norm_kernel[(rows,)](
            x, residual if residual is not None else x, weight, out,
            total if total is not None else out, width, float(eps),
            HAS_RESIDUAL=residual is not None, BLOCK=max(16, triton.next_power_of_2(width)),
            UPCAST=interpreter_upcast(x), num_warps=4)
    return out if residual is None else (out, total)


def _rms_norm_supports(width=None, **_) -> str | None:
    if width is not None and width > RMS_NORM_MAX_WIDTH:
        return (f"x: expected a last dimension <= {RMS_NORM_MAX_WIDTH} "
                f"(decoder_triton.RMS_NORM_MAX_WIDTH), got {width}")
    return None


@triton.jit
def _rope_heads(x_rows, out_rows, head, heads, positions_ptr, cos_ptr, sin_ptr, token,
                table_rows, DIM: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """``x * cos[p] + rotate_half(x) * sin[p]`` for heads ``head`` (those < ``heads``) of one
    token at position p = positions[token]: ``x_rows`` / ``out_rows`` point at the token's
    first head ([heads, DIM] contiguous). Each product and the sum rounded to the output's
    dtype as the reference's three torch ops round them (launched without multiply-add
    contraction): its bits exactly. A position outside the tables (value checks off) reads row
    0 instead."""
    d = tl.arange(0, BLOCK_D)
    half = DIM // 2
    position = tl.load(positions_ptr + token)
    position = tl.where((position >= 0) & (position < table_rows), position, 0)
    d_ok = d < DIM
    cos = tl.load(cos_ptr + position * DIM + d, mask=d_ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + position * DIM + d, mask=d_ok, other=0.0).to(tl.float32)
    ok = (head < heads)[:, None] & d_ok[None, :]
    rows = x_rows + head[:, None] * DIM
    x = tl.load(rows + d[None, :], mask=ok, other=0.0).to(tl.float32)
    partner = tl.where(d < half, d + half, d - half)  # rotate_half: (-x2, x1)
    rotated = tl.load(rows + partner[None, :], mask=ok, other=0.0).to(tl.float32)
    # times -1, not a negation: Triton 3.6 lowers -x to 0 - x, which turns torch's -0.0 into +0.0
    rotated = rotated * tl.where(d < half, -1.0, 1.0)[None, :]
    dtype = out_rows.dtype.element_ty
    first = _cast(x * cos[None, :], dtype, UPCAST).to(tl.float32)
    second = _cast(rotated * sin[None, :], dtype, UPCAST).to(tl.float32)
    tl.store(out_rows + head[:, None] * DIM + d[None, :], _cast(first + second, dtype, UPCAST),
             mask=ok)


@triton.jit
def _rope_kernel(x_ptr, positions_ptr, cos_ptr, sin_ptr, out_ptr, heads, table_rows,
                 DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                 UPCAST: tl.constexpr):
    """Program (token, head block): RoPE of BLOCK_H heads of one token (_rope_heads)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    first_head = token * heads * DIM
    _rope_heads(x_ptr + first_head, out_ptr + first_head, head, heads, positions_ptr, cos_ptr,
                sin_ptr, token, table_rows, DIM, BLOCK_D, UPCAST)


def rope_blocks(heads: int, dim: int) -> tuple[int, int]:
    """(BLOCK_H, BLOCK_D) of a RoPE launch over ``heads`` heads of ``dim``: whole heads, at
    most ROPE_BLOCK_ELEMENTS per program."""
    block_d = triton.next_power_of_2(dim)
    return max(1, min(triton.next_power_of_2(heads), ROPE_BLOCK_ELEMENTS // block_d)), block_d


def _apply_rope_triton(x, positions, cos, sin):
    """Triton backend of apply_rope (checked arguments): one launch for every token and head,
    where the reference takes seven (two gathers, the half rotation, products, sum)."""
    batch, count, heads, dim = x.shape
    out = torch.empty_like(x)
    if out.numel():
        block_h, block_d = rope_blocks(heads, dim)
        _rope_kernel[(batch * count, triton.cdiv(heads, block_h))](
            x, positions, cos, sin, out, heads, cos.shape[0], DIM=dim, BLOCK_H=block_h,
            BLOCK_D=block_d, UPCAST=interpreter_upcast(x), num_warps=4, **EXACT_ROUNDING)
    return out


SILU_MUL_BLOCK = 1024  # elements per program


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, count, BLOCK: tl.constexpr,
                     UPCAST: tl.constexpr):
    """``silu(gate) * up`` on BLOCK elements: silu in fp32 rounded to the dtype, then the
    product rounded, as the reference's two torch ops (on a GPU tl.exp is an approximate
    exp2 and the division not IEEE: fp32 results a few ulps from torch's)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < count
    gate = tl.load(gate_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = _cast(gate / (1.0 + tl.exp(-gate)), dtype, UPCAST).to(tl.float32)
    tl.store(out_ptr + offs, _cast(silu * up, dtype, UPCAST), mask=ok)


def _silu_mul_triton(gate, up):
    """Triton backend of silu_mul (checked arguments, contiguous): one launch, not two."""
    out = torch.empty_like(gate)
    if out.numel():
        _silu_mul_kernel[(triton.cdiv(out.numel(), SILU_MUL_BLOCK),)](
            gate, up, out, out.numel(), BLOCK=SILU_MUL_BLOCK, UPCAST=interpreter_upcast(gate),
            num_warps=4)
    return out


register("linear", "triton", _linear_group_triton, auto=False)
register("apply_rope", "triton", _apply_rope_triton, auto=False)
register("silu_mul", "triton", _silu_mul_triton, auto=False)
register("rms_norm", "triton", _rms_norm_triton, auto=False, supports=_rms_norm_supports)
