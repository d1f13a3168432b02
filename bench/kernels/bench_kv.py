"""compact_kv, write_kv and rope_write_kv: Triton / CUDA kernels vs the torch reference, with
the memory floor.

    python bench/kernels/bench_kv.py [--out DIR] [--smoke]

Caches shaped like Llama-3.1-8B (32 layers x K and V, 8 KV heads x 128, bf16) and Vicuna-7B
(32 x 2, 32 x 128); accepted paths of n = 1..N nodes. Floor: the accepted rows read and written
once (2 x B x (n - 1) x row bytes x caches, op_bytes.py) over the fastest bandwidth measured in
the run (common.floor_us). Kernels are timed as CUDA-graph replays; the torch reference (a
Python loop over sequences and caches) eagerly, only for batch <= 16. write_kv: one layer's new
K and V rows of a decode step (T = 1) and a verify pass (T = 60), floor the rows read and
written once; torch (index arithmetic and two indexed stores) and Triton (one launch) both as
CUDA-graph replays, as a decode loop runs them. rope_write_kv: the same rows with 32 q heads,
RoPE of q and k in the same launch (Triton) against the reference (seven launches per rotation)
and the Triton kernels launched apart; floor q, k and v read and written once plus the
positions and their cos / sin rows.
``--smoke``: tiny caches, torch + Triton interpreter on CPU.
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
from common import (append_rows, floor_us, graphed, memory_bandwidth, plot_rows,  # noqa: E402
                    time_fn, bench_arguments, timing_columns)
from op_bytes import kv_copy_bytes, rope_bytes  # noqa: E402

from eagle_kernels import ops  # noqa: E402
from eagle_kernels.ops._backend import backend_status  # noqa: E402

MODELS = {"llama3-8b": (32, 8, 128), "vicuna-7b": (32, 32, 128), "smoke": (2, 2, 8)}


def make_case(model, batch, accepted, max_len, device, gen):
    layers, heads, dim = MODELS[model]
    caches = [torch.empty(batch, max_len, heads, dim, dtype=torch.bfloat16, device=device)
              for _ in range(2 * layers)]
    lens = torch.randint(0, max_len // 2, (batch,), generator=gen).to(torch.int32).to(device)
    nodes = torch.arange(0, 2 * accepted, 2, dtype=torch.int32).expand(batch, -1).contiguous()
    count = torch.full((batch,), accepted - 1, dtype=torch.int32)
    return caches, lens, nodes.to(device), count.to(device)


def write_kv_rows(device, gen, smoke, max_len, bandwidth, repeats) -> list[dict]:
    """write_kv, and rope_write_kv with q's heads (four per KV head, as Llama-3.1-8B) against
    the same kernels launched apart (``triton_apart``: apply_rope twice, then write_kv)."""
    rows = []
    grid = [("smoke", 2, 3)] if smoke else [(m, b, t) for m in ("llama3-8b",) for b in (1, 16)
                                            for t in (1, 60)]
    available = [b for b in ("torch", "triton") if backend_status(b).available]
    for model, batch, count in grid:
        _, heads, dim = MODELS[model]
        q = torch.randn(batch, count, 4 * heads, dim, generator=gen).to(torch.bfloat16).to(device)
        k, v = (torch.randn(batch, count, heads, dim, generator=gen).to(torch.bfloat16)
                .to(device) for _ in range(2))
        caches = [torch.zeros(batch, max_len, heads, dim, dtype=torch.bfloat16, device=device)
                  for _ in range(2)]
        lens = torch.randint(0, max_len - count, (batch,), generator=gen,
                             dtype=torch.int32).to(device)
        positions = (lens.long().unsqueeze(1) + torch.arange(count, device=device)).contiguous()
        angles = torch.randn(max_len, dim // 2, generator=gen).repeat(1, 2).to(device)
        cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
        calls = {"write_kv": {b: lambda b=b: ops.write_kv(k, v, *caches, lens, 0, backend=b)
                              for b in available},
                 "rope_write_kv": {b: lambda b=b: ops.rope_write_kv(
                     q, k, v, positions, cos, sin, *caches, lens, 0, backend=b)
                     for b in available}}
        if "triton" in available:
            calls["rope_write_kv"]["triton_apart"] = lambda: (
                ops.apply_rope(q, positions, cos, sin, backend="triton"),
                ops.write_kv(ops.apply_rope(k, positions, cos, sin, backend="triton"), v,
                             *caches, lens, 0, backend="triton"))
        # rows read and written once: k and v (and q, rotated) in, cache rows (and q) out; the
        # rotation reads the positions and one cos and one sin row per distinct position
        moved = {"write_kv": kv_copy_bytes(batch * count, heads * dim * 2, 2),
                 "rope_write_kv": rope_bytes(q.numel() + k.numel(), v.numel(), positions.numel(),
                                             positions.unique().numel(), dim, 2, 2)}
        for op, by_backend in calls.items():
            timings = {backend: time_fn(graphed(call) if device.type == "cuda" else call,
                                        repeats=repeats, warmup=1 if device.type == "cpu" else 3)
                       for backend, call in by_backend.items()}
            for backend, timing in timings.items():
                row = dict(op=op, model=model, backend=backend, dtype="bfloat16", batch=batch,
                           accepted=count, caches=2,
                           **timing_columns(timing, timings.get("torch"),
                                            floor_us(moved[op], bandwidth)),
                           bytes=moved[op], **bandwidth.columns())
                rows.append(row)
                print(" ".join(f"{k}={v}" for k, v in row.items()))
    return rows


def main():
    args, device = bench_arguments(__doc__.split("\n")[0])
    gen = torch.Generator().manual_seed(0)
    if args.smoke:
        grid, max_len, repeats = [("smoke", 2, 3)], 32, 3
    else:
        grid = [(m, b, n) for m in ("llama3-8b", "vicuna-7b") for b in (1, 16, 64)
                for n in (2, 8)]
        max_len, repeats = 512, 20
    bandwidth = memory_bandwidth(device, 64 if args.smoke else 1024)
    print(f"device {device}, {bandwidth}")
    rows = []
    for model, batch, accepted in grid:
        caches, lens, nodes, count = make_case(model, batch, accepted, max_len, device, gen)
        row_bytes = caches[0][0, 0].numel() * 2
        moved = kv_copy_bytes(batch * (accepted - 1), row_bytes, len(caches))
        floor = floor_us(moved, bandwidth)
        timings = {}
        for backend in ("torch", "triton", "cuda"):
            if not backend_status(backend).available or (backend == "cuda" and
                                                         device.type != "cuda"):
                continue
            if backend == "torch" and batch > 16:
                continue

            def call(backend=backend):
                ops.compact_kv(caches, lens, nodes, count, backend=backend)

            graph_it = device.type == "cuda" and backend != "torch"
            timings[backend] = time_fn(graphed(call) if graph_it else call, repeats=repeats,
                                       warmup=1 if device.type == "cpu" else 3)
        base = timings.get("torch")
        for backend, timing in timings.items():
            row = dict(op="compact_kv", model=model, backend=backend, dtype="bfloat16",
                       batch=batch,
                       accepted=accepted, caches=len(caches),
                       **timing_columns(timing, base, floor), bytes=moved,
                       **bandwidth.columns())
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()))
    rows += write_kv_rows(device, gen, args.smoke, max_len, bandwidth, repeats)
    out = Path(args.out)
    append_rows(out / "bench_kv.csv", rows)
    plot_rows([dict(r, series=f"{r['op']} {r['backend']} {r['model']} "
                              f"{'n' if r['op'] == 'compact_kv' else 'T'}={r['accepted']}")
               for r in rows], "batch", "median_us", "series", out / "bench_kv.png",
              "compact_kv (n accepted) / write_kv, rope_write_kv (T new rows)")


if __name__ == "__main__":
    main()
