"""linear / linear_group / rms_norm / apply_rope / silu_mul: the Triton kernels vs torch, with
the memory floor.

    python bench/kernels/bench_decoder.py [--out DIR] [--smoke]

Llama-3.1-8B projections in bf16 (o_proj 4096 -> 4096, gate 4096 -> 14336, down 14336 -> 4096,
lm_head 4096 -> 128256) at M = 1 (decode), 16, 60 (a verify tree) and 240 (batch 4 x 60) rows,
its RMSNorm (4096 wide), its RoPE over 32 heads of 128 and its SiLU-gated product (14336 wide):
one Triton launch each, where torch takes seven and two. Its q / k / v and SmolLM2-135M's as
one linear_group: two Triton launches (the tiles, the K-split sums) against six launched per
weight (``triton_per_weight``, the same bits). What row invariance costs on the GPU:
greedy speculative decoding is lossless by construction only with these kernels
(ops/decoder_triton.py), so they run whatever their speed. ``triton_m16`` / ``triton_m32``: the
linear with its fixed row tile (LINEAR_BLOCK_M, 64) at 16 / 32 rows, still row-invariant (one
tile for every M): fewer weight reads at 60-240 rows against padded rows at 1; which fixed tile
to ship, measured. ``triton_fused_sum``: the experiment of linear_fused_sum.py (the K-split sums
added by each tile's last split program, no second launch), timed only where its output equals
the shipped kernel's bit for bit. Floor: the weights (and the rows in and out; RoPE's table rows) read once
(op_bytes.py) over the fastest bandwidth measured in the run (common.floor_us). Timed as
CUDA-graph replays, torch too. ``--smoke``: tiny shapes, torch + the Triton
interpreter on CPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("EAGLE_KERNELS_CHECK_VALUES", "0")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (append_rows, bench_arguments, floor_us, graphed,  # noqa: E402
                    memory_bandwidth, plot_rows, time_fn, timing_columns, with_constants)
from linear_fused_sum import linear_fused_sum  # noqa: E402
from op_bytes import linear_bytes, rms_norm_bytes, rope_bytes, silu_mul_bytes  # noqa: E402

from eagle_kernels import ops  # noqa: E402
from eagle_kernels.ops import decoder_triton  # noqa: E402
from eagle_kernels.ops._backend import backend_status  # noqa: E402

LLAMA_8B = {"o_proj": (4096, 4096), "gate_proj": (14336, 4096), "down_proj": (4096, 14336),
            "lm_head": (128256, 4096)}
SMOKE = {"o_proj": (64, 48)}
# q / k / v over one input: (output widths, input width)
GROUPS = {"llama q/k/v": ((4096, 1024, 1024), 4096), "smollm2 q/k/v": ((576, 192, 192), 576)}
SMOKE_GROUPS = {"q/k/v": ((48, 16, 16), 48)}
LINEAR_VARIANTS = {"triton_m16": {"LINEAR_BLOCK_M": 16}, "triton_m32": {"LINEAR_BLOCK_M": 32}}


def _backends(device) -> list[str]:
    return ["torch"] + (["triton"] if backend_status("triton").available else [])


def _time(call, device, repeats):
    fn = graphed(call) if device.type == "cuda" else call
    return time_fn(fn, repeats=repeats, warmup=1 if device.type == "cpu" else 3)


def _rows(op, weight, m, timings, moved, bandwidth) -> list[dict]:
    """One printed row per backend of ``timings`` (bf16, m rows), each against torch's, with
    the floor of ``moved`` bytes."""
    floor = floor_us(moved, bandwidth)
    rows = [dict(op=op, weight=weight, backend=backend, dtype="bfloat16", rows=m,
                 **timing_columns(timing, timings["torch"], floor), bytes=moved,
                 **bandwidth.columns())
            for backend, timing in timings.items()]
    for row in rows:
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return rows


def linear_rows(device, gen, shapes, row_counts, bandwidth, repeats) -> list[dict]:
    rows = []
    for name, (out, width) in shapes.items():
        weight = (torch.randn(out, width, generator=gen) * width**-0.5).to(torch.bfloat16)
        weight = weight.to(device)
        for m in row_counts:
            x = torch.randn(m, width, generator=gen).to(torch.bfloat16).to(device)
            moved = linear_bytes(m, width, (out,), 2)
            timings = {backend: _time(lambda b=backend: ops.linear(x, weight, backend=b),
                                      device, repeats) for backend in _backends(device)}
            if "triton" in timings:
                for variant, constants in LINEAR_VARIANTS.items():
                    timings[variant] = _time(lambda c=constants: with_constants(
                        decoder_triton, c, lambda: ops.linear(x, weight, backend="triton")),
                        device, repeats)
                fused = fused_sum_timing(x, weight, device, repeats)
                if fused is not None:
                    timings["triton_fused_sum"] = fused
            rows += _rows("linear", name, m, timings, moved, bandwidth)
        weight = None  # the GPU copy freed before the next shape's (lm_head: 1 GB)
    return rows


def fused_sum_timing(x, weight, device, repeats):
    """The experiment of linear_fused_sum.py (split sums in the tiles' last programs), timed
    only where its output equals the shipped kernel's bit for bit here (three calls: on a GPU a
    race would show), else None and a printed line saying so."""
    want = ops.linear(x, weight, backend="triton")
    if not all(torch.equal(linear_fused_sum(x, weight), want) for _ in range(3)):
        print(f"triton_fused_sum: output differs from the shipped kernel's at {tuple(x.shape)} "
              f"x {tuple(weight.shape)}: not timed", flush=True)
        return None
    return _time(lambda: linear_fused_sum(x, weight), device, repeats)


def group_rows(device, gen, groups, row_counts, bandwidth, repeats) -> list[dict]:
    """q / k / v: the Triton group in one launch (and one of its split sums) against the same
    kernel launched per weight (``triton_per_weight``, same bits) and torch's three GEMMs."""
    rows = []
    for name, (outs, width) in groups.items():
        weights = [(torch.randn(out, width, generator=gen) * width**-0.5).to(torch.bfloat16)
                   .to(device) for out in outs]
        for m in row_counts:
            x = torch.randn(m, width, generator=gen).to(torch.bfloat16).to(device)
            moved = linear_bytes(m, width, outs, 2)
            timings = {backend: _time(lambda b=backend: ops.linear_group(x, weights, backend=b),
                                      device, repeats) for backend in _backends(device)}
            if "triton" in timings:
                timings["triton_per_weight"] = _time(
                    lambda: [ops.linear(x, w, backend="triton") for w in weights], device,
                    repeats)
            rows += _rows("linear_group", name, m, timings, moved, bandwidth)
    return rows


def rms_norm_rows(device, gen, width, row_counts, bandwidth, repeats) -> list[dict]:
    rows = []
    weight = torch.randn(width, generator=gen).to(torch.bfloat16).to(device)
    for m in row_counts:
        x, residual = (torch.randn(m, width, generator=gen).to(torch.bfloat16).to(device)
                       for _ in range(2))
        moved = rms_norm_bytes(m, width, 2)  # x, residual, weight in; normed, sum out
        timings = {backend: _time(lambda b=backend: ops.rms_norm(x, weight, 1e-5, residual,
                                                                 backend=b), device, repeats)
                   for backend in _backends(device)}
        rows += _rows("rms_norm", f"width {width}", m, timings, moved, bandwidth)
    return rows


def elementwise_rows(device, gen, hidden, heads, head_dim, row_counts, bandwidth,
                     repeats) -> list[dict]:
    """apply_rope over one layer's q heads and silu_mul over its MLP width: the Triton kernel
    (one launch) against the reference's torch ops (seven / two launches)."""
    rows = []
    table = torch.randn(8192, head_dim, generator=gen).to(torch.bfloat16).to(device)
    for m in row_counts:
        x = torch.randn(1, m, heads, head_dim, generator=gen).to(torch.bfloat16).to(device)
        positions = torch.randint(0, 8192, (1, m), generator=gen).to(device)
        # cos and sin are one table here: its rows at the distinct positions, read once
        moved = rope_bytes(x.numel(), 0, positions.numel(), positions.unique().numel(),
                           head_dim, 1, 2)
        timings = {backend: _time(lambda b=backend: ops.apply_rope(x, positions, table, table,
                                                                   backend=b), device, repeats)
                   for backend in _backends(device)}
        rows += _rows("apply_rope", f"{heads} x {head_dim}", m, timings, moved, bandwidth)
        gate, up = (torch.randn(m, hidden, generator=gen).to(torch.bfloat16).to(device)
                    for _ in range(2))
        moved = silu_mul_bytes(m, hidden, 2)
        timings = {backend: _time(lambda b=backend: ops.silu_mul(gate, up, backend=b), device,
                                  repeats) for backend in _backends(device)}
        rows += _rows("silu_mul", f"width {hidden}", m, timings, moved, bandwidth)
    return rows


def main():
    args, device = bench_arguments(__doc__.split("\n")[0])
    gen = torch.Generator().manual_seed(0)
    if args.smoke:
        shapes, groups, row_counts, width, repeats = SMOKE, SMOKE_GROUPS, (1, 5), 48, 3
    else:
        shapes, groups, row_counts, width, repeats = LLAMA_8B, GROUPS, (1, 16, 60, 240), 4096, 20
    bandwidth = memory_bandwidth(device, 64 if args.smoke else 1024)
    print(f"device {device}, {bandwidth}")
    rows = linear_rows(device, gen, shapes, row_counts, bandwidth, repeats)
    rows += group_rows(device, gen, groups, row_counts, bandwidth, repeats)
    rows += rms_norm_rows(device, gen, width, row_counts, bandwidth, repeats)
    if args.smoke:
        rows += elementwise_rows(device, gen, 40, 3, 16, row_counts, bandwidth, repeats)
    else:
        rows += elementwise_rows(device, gen, 14336, 32, 128, row_counts, bandwidth, repeats)
    out = Path(args.out)
    append_rows(out / "bench_decoder.csv", rows)
    plot_rows([dict(r, series=f"{r['backend']} {r['op']} {r['weight']}") for r in rows],
              "rows", "median_us", "series", out / "bench_decoder.png", "decoder ops")


if __name__ == "__main__":
    main()
