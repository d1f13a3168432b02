"""An experiment for the next GPU run, not a shipped kernel: the row-invariant Triton linear
with its K-split partial sums added by each output tile's last split program instead of a
second launch.

Why: on the H200 (bench/results/2026-11-28b_nvidia-h200/trace) the split sums of the
Llama-3.1-8B-shape step take 0.25 ms of its 5.44 ms replay (128 launches) and 0.44 ms of a
60-node verify pass; at SmolLM2's shape, where a step is launch-bound, their 120 launches a
pass weigh more. How: every split program stores its fp32 partial as the shipped kernel does
(``decoder_triton._linear_tile``), then moves its tile's counter; the program that finds
itself last adds the tile's partials in split order, adds the bias and rounds, exactly the
arithmetic of ``decoder_triton._sum_splits_block`` (fp32 adds in the same order: the same bits,
so the row invariance holds), and resets the counter for the next launch or graph replay.
Ordering: a CTA barrier before the counter's acquire-release atomic (every thread's partial
stored first), loads of the partials through L2 (``.cg``). On one stream at a time only (the
counters are shared).

It lives here, outside eagle_kernels.ops, so the shipped kernels' source digests (what a GPU
verdict proved) stay as they are; bench_decoder.py times it (``triton_fused_sum``) only where
its output equals the shipped kernel's bit for bit on that GPU, and tests/test_decoder_triton.py
checks the same in the interpreter.
"""

from __future__ import annotations

import torch

from eagle_kernels.ops._triton import tl, triton
from eagle_kernels.ops.attention_triton import _cast, dot_precision, interpreter_upcast
from eagle_kernels.ops import decoder_triton
from eagle_kernels.ops.decoder_triton import (LINEAR_BLOCK_K, LINEAR_BLOCK_M, LINEAR_BLOCK_N,
                                              _linear_tile)
from eagle_kernels import ops

_COUNTERS: dict[tuple, torch.Tensor] = {}  # (device, tiles) -> int32 zeros, reset by each launch


@triton.jit
def _linear_fused_sum_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, count_ptr, rows, cols,
                             width, split_blocks, splits, HAS_BIAS: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
                             UPCAST: tl.constexpr):
    """Program (row tile, column tile, K split): the split's partial, then, in the tile's last
    split program to arrive, the tile's output from all its partials in split order."""
    tile_m = tl.program_id(0)
    tile_n = tl.program_id(1)
    split = tl.program_id(2)
    _linear_tile(x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, rows, cols, width, split_blocks,
                 tile_m, tile_n, split, HAS_BIAS, True, BLOCK_M, BLOCK_N, BLOCK_K,
                 DOT_PRECISION, UPCAST)
    tl.debug_barrier()  # every thread's partial stored before the tile's counter moves
    counter = count_ptr + tile_m * tl.num_programs(1) + tile_n
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if arrived == splits - 1:
        rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = rn < cols
        ok = (rm < rows)[:, None] & col_ok[None, :]
        offsets = rm.to(tl.int64)[:, None] * cols + rn[None, :]
        count = rows.to(tl.int64) * cols
        total = tl.load(part_ptr + offsets, mask=ok, other=0.0, cache_modifier=".cg")
        for s in range(1, splits):
            total += tl.load(part_ptr + s * count + offsets, mask=ok, other=0.0,
                             cache_modifier=".cg")
        if HAS_BIAS:
            total += tl.load(bias_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offsets, _cast(total, out_ptr.dtype.element_ty, UPCAST), mask=ok)
        tl.atomic_xchg(counter, 0)


def linear_fused_sum(x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """``ops.linear(x, weight, bias, backend="triton")`` with the split sums fused (see the
    module docstring); a weight the shipped kernel does not split runs the shipped kernel.
    x [..., K] and weight [N, K] contiguous, one dtype and device."""
    rows, width = x.numel() // x.shape[-1], x.shape[-1]
    if rows == 0:
        return ops.linear(x, weight, bias, backend="triton")
    x2d = x.reshape(rows, width)
    out = torch.empty(rows, weight.shape[0], dtype=x.dtype, device=x.device)
    # the shipped launch's split count and workspace for this weight (same splits, same bits)
    tile_args, (has_bias, split), _ = decoder_triton._weight_launch(x2d, weight, bias, out)
    if not split:
        return ops.linear(x, weight, bias, backend="triton")
    weight, bias_arg, out, part, cols, split_blocks, splits = tile_args
    grid = (triton.cdiv(rows, LINEAR_BLOCK_M), triton.cdiv(cols, LINEAR_BLOCK_N), splits)
    key = (x.device, grid[0] * grid[1])
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(grid[0] * grid[1], dtype=torch.int32, device=x.device)
    _linear_fused_sum_kernel[grid](
        x2d, weight, bias_arg, out, part, _COUNTERS[key], rows, cols, width, split_blocks,
        splits, HAS_BIAS=has_bias, BLOCK_M=LINEAR_BLOCK_M, BLOCK_N=LINEAR_BLOCK_N,
        BLOCK_K=LINEAR_BLOCK_K, DOT_PRECISION=dot_precision(x2d),
        UPCAST=interpreter_upcast(x2d), num_warps=4)
    return out.view(*x.shape[:-1], cols)
