"""Acceptance ops: Triton / CUDA kernels vs the torch reference, with the memory floor.

    python bench/kernels/bench_acceptance.py [--out DIR] [--smoke]

For each op (greedy / stochastic, tree / chain), batch, node count N and vocabulary: the median
time of every backend that runs here, its speedup over the torch reference measured in the
same run, and the fraction of the memory floor it reaches (floor = the bytes the op must move,
op_bytes.acceptance_bytes: every node's target logits, the per-node inputs, the outputs and, for
stochastic_accept_chain, q(x) of every draft token plus the whole draft row of each sequence
that rejects one; over the fastest bandwidth measured in the run, common.floor_us; a kernel at
the floor scores 1.0). Kernels are timed as CUDA-graph replays (what the runtime sees; see
common.graphed). The torch reference loops over sequences in Python with host syncs, so it is
timed eagerly and only where batch <= 16 and vocab == 32000 (speedup is blank elsewhere). The
FlashInfer comparison point (batch 16, vocab 32000, chain of 5 draft tokens: 27 us on B200,
published) is printed at the end.
``--smoke`` runs tiny sizes (torch + the Triton interpreter on CPU) to prove the script works.
Results: ``<out>/bench_acceptance.csv`` and PNGs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined
os.environ.setdefault("EAGLE_KERNELS_CHECK_VALUES", "0")  # no host syncs inside timed calls

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Bandwidth, append_rows, bench_arguments, floor_us, graphed,  # noqa: E402
                    memory_bandwidth, plot_rows, time_fn, timing_columns,
                    written_if_interrupted)
from op_bytes import acceptance_bytes, rejected_chains  # noqa: E402

from eagle_kernels import ops  # noqa: E402
from eagle_kernels.ops import reference  # noqa: E402
from eagle_kernels.ops._backend import _supports_device, backend_status, op_backends  # noqa: E402

FLASHINFER = dict(batch=16, nodes=6, vocab=32000, us=27.0)  # chain of 5 draft tokens, B200


def make_inputs(op, batch, nodes, vocab, dtype, device):
    """Inputs of one op, drawn on the device (GBs at the largest sizes): chain-shaped trees, so
    every op sees the same nodes."""
    logits = torch.randn(batch, nodes, vocab, device=device).to(dtype)
    tokens = torch.randint(0, vocab, (batch, nodes), device=device)
    uniforms = torch.rand(batch, nodes, device=device)
    bonus = torch.rand(batch, device=device)
    parents = torch.arange(-1, nodes - 1, dtype=torch.int32).expand(batch, -1).contiguous()
    if op == "greedy_accept_tree":
        return (tokens, reference.build_tree(parents)[2].to(device), logits)
    if op == "greedy_accept_chain":
        return (tokens, logits)
    if op == "stochastic_accept_tree":
        return (tokens, parents.to(device), logits, uniforms, bonus)
    draft = torch.softmax(torch.randn(batch, nodes - 1, vocab, device=device), -1)
    return (tokens, draft, logits, uniforms, bonus)


def runnable_backends(op, device):
    names = []
    for name in op_backends()[op]:
        if not backend_status(name).available:
            continue
        if not _supports_device(name, device):  # the registry's own rule (cpu: CPU tensors)
            continue
        names.append(name)
    return names


def time_backend(op, backend, args, device, repeats):
    fn = getattr(ops, op)

    def call():
        return fn(*args, backend=backend)

    if device.type == "cuda" and backend != "torch":
        return time_fn(graphed(call), repeats=repeats)
    return time_fn(call, repeats=repeats, warmup=1 if device.type == "cpu" else 3)


def configs(smoke):
    """([(cases of (batch, nodes, vocab), logits dtype)] in the order they run, repeats): a few
    points in every logits dtype first (the verdict lets a dtype into auto only on rows of its
    own dtype, and a stage step cut short keeps the rows timed so far), then the rest of the
    grid in bf16 (what a bf16 target gives)."""
    if smoke:
        return [([(2, 4, 64)], torch.float32)], 3
    point = (FLASHINFER["batch"], FLASHINFER["nodes"], FLASHINFER["vocab"])
    few = [(1, 8, 32000), (16, 64, 32000), point]
    grid = [(b, n, v) for v in (32000, 128256, 151936) for b in (1, 16, 64) for n in (8, 64)]
    rest = [case for case in grid if case not in few]
    return [(few, torch.bfloat16), (few, torch.float16), (few, torch.float32),
            (rest, torch.bfloat16)], 20


def moved_bytes(op, inputs, batch, nodes, vocab, dtype) -> int:
    """The bytes one call of ``op`` on ``inputs`` (make_inputs) must move."""
    if op == "greedy_accept_tree":
        paths = inputs[1]
        return acceptance_bytes(op, batch, nodes, vocab, dtype.itemsize, width=paths.shape[2],
                                path_entries=int((paths >= 0).sum()))
    if op == "stochastic_accept_chain":
        tokens, draft, logits, uniforms, _ = inputs
        return acceptance_bytes(op, batch, nodes, vocab, dtype.itemsize,
                                rejected=rejected_chains(tokens, draft, logits, uniforms))
    return acceptance_bytes(op, batch, nodes, vocab, dtype.itemsize)


def measure(args, device, grids, repeats: int, bandwidth: Bandwidth, rows: list[dict]) -> None:
    """Time every op over every (grid, dtype), appending rows to ``rows`` as they come."""
    for (batch, nodes, vocab), dtype in ((case, dtype) for grid, dtype in grids for case in grid):
        for op in ("greedy_accept_chain", "greedy_accept_tree", "stochastic_accept_chain",
                   "stochastic_accept_tree"):
            inputs = make_inputs(op, batch, nodes, vocab, dtype, device)
            moved = moved_bytes(op, inputs, batch, nodes, vocab, dtype)
            floor = floor_us(moved, bandwidth)
            timings = {}
            for backend in runnable_backends(op, device):
                if backend == "torch" and not args.smoke and (batch > 16 or vocab != 32000):
                    continue  # Python loop over sequences: see the module docstring
                timings[backend] = time_backend(op, backend, inputs, device, repeats)
            base = timings.get("torch")
            for backend, timing in timings.items():
                row = dict(op=op, backend=backend, batch=batch, nodes=nodes, vocab=vocab,
                           dtype=str(dtype).replace("torch.", ""),
                           **timing_columns(timing, base, floor), bytes=moved,
                           **bandwidth.columns())
                rows.append(row)
                print(" ".join(f"{k}={v}" for k, v in row.items()))


def main():
    args, device = bench_arguments(__doc__.split("\n")[0])
    torch.manual_seed(0)
    grids, repeats = configs(args.smoke)
    bandwidth = memory_bandwidth(device, 64 if args.smoke else 1024)
    print(f"device {device}, {bandwidth}")
    rows = []
    out = Path(args.out)
    with written_if_interrupted(lambda: append_rows(out / "bench_acceptance.csv", rows)):
        measure(args, device, grids, repeats, bandwidth, rows)
    append_rows(out / "bench_acceptance.csv", rows)
    plotted = grids[-1][1]  # the full grid's dtype
    for op in {row["op"] for row in rows}:
        subset = [dict(row, series=f"{row['backend']} N={row['nodes']} V={row['vocab']}")
                  for row in rows if row["op"] == op and row["vocab"] in (32000, 64)
                  and row["dtype"] == str(plotted).replace("torch.", "")]
        plot_rows(subset, "batch", "median_us", "series", out / f"bench_{op}.png",
                  f"{op} ({plotted}, {device.type})")
    point = [r for r in rows if (r["batch"], r["nodes"], r["vocab"]) == (
        FLASHINFER["batch"], FLASHINFER["nodes"], FLASHINFER["vocab"])
        and r["op"] == "stochastic_accept_chain"]
    for row in point:
        print(f"FlashInfer point (B=16, V=32000, chain of 5; FlashInfer 27 us on B200): "
              f"{row['backend']} {row['dtype']} {row['median_us']} us, floor {row['floor_us']} us "
              f"({row['floor_fraction']} of floor)")


if __name__ == "__main__":
    main()
