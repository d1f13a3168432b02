"""Nsight Compute on the kernels whose GPU bars are missed: which unit or memory level limits them.

    python3 bench/profile_kernels.py --out DIR [--case NAME ...]   # every case, each under ncu
    python3 bench/profile_kernels.py --run CASE                    # one case (what ncu runs)
    python3 bench/profile_kernels.py --summarize DIR               # profile.csv from ncu-*.csv

Cases (bf16; the shapes of the missed bars, bench/results/2026-11-26_nvidia-h100-80gb-hbm3):

* ``attention_*``: tree attention, N = 60, Llama-3.1-8B heads, batch 1, 4k context: the Triton
  kernels' row-invariant two passes at their 16-row tile (the default), both at a 64-row tile,
  the first pass alone at 64 rows (``_pm64``), their unordered walk (not row-invariant), and
  the CUDA kernel;
* ``linear_*``: gate_proj (14336 x 4096) over 60 rows: the row-invariant Triton GEMM (its
  64-row tile, the default, the 16-row one it had, and linear_fused_sum.py's experiment with
  the split sums in the tiles' last programs) and cuBLAS;
* ``chain_*``: stochastic chain acceptance at batch 16, chain of 5, vocabulary 32000 (the
  27 us bar; bench/results/2026-11-27_nvidia-h200), Triton (chunked since) and CUDA;
* ``topk_triton``: topk_log_softmax of 10 rows of 32000, k 10 (a drafting step's).

Each case warms up (Triton compiles, cuBLAS picks), then calls the op once between
cudaProfilerStart / Stop; ncu (``--profile-from-start off``) profiles every kernel of that call
with the SpeedOfLight, MemoryWorkloadAnalysis, Occupancy, LaunchStats and WarpStateStats
sections into ``ncu-<case>.csv`` (raw, kept). ``profile.csv`` / ``profile.txt``: per kernel its
duration, compute (SM), memory, DRAM, L1 and L2 throughput (% of peak), achieved and
theoretical occupancy, registers per thread, grid and block, and warp cycles per issued
instruction; ``limiter`` names the highest throughput (a kernel far below every peak is
latency-bound: few warps, or dependent loads).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
            "WarpStateStats")
ATTENTION_SHAPE = ("llama3-8b", 1, 4096)  # model, batch, context (bench_attention's grid)
LINEAR_SHAPE = (60, 14336, 4096)  # rows, out features, in features (gate_proj)
CHAIN_SHAPE = (16, 6, 32000)  # batch, nodes (root + 5 drafted), vocabulary: FlashInfer's point
CASE_TIMEOUT_S = 90
# profile.csv columns: ncu's metric names (SpeedOfLight, Occupancy, LaunchStats, WarpStateStats)
COLUMNS = {
    "duration_us": "Duration",
    "sm_pct": "Compute (SM) Throughput",
    "memory_pct": "Memory Throughput",
    "dram_pct": "DRAM Throughput",
    "l1_pct": "L1/TEX Cache Throughput",
    "l2_pct": "L2 Cache Throughput",
    "achieved_occupancy_pct": "Achieved Occupancy",
    "theoretical_occupancy_pct": "Theoretical Occupancy",
    "registers": "Registers Per Thread",
    "cycles_per_issue": "Warp Cycles Per Issued Instruction",
}
THROUGHPUTS = ("sm_pct", "dram_pct", "l1_pct", "l2_pct")


def _attention_call(backend: str, variant: str | None = None):
    """Tree attention at ATTENTION_SHAPE; ``variant``: a bench_attention.TRITON_VARIANTS or
    PREFIX_TILE_VARIANTS key."""
    import torch

    import bench_attention as ba
    from common import with_constants
    from eagle_kernels import ops

    model, batch, context = ATTENTION_SHAPE
    q, k, v, lens, mask = ba.make_case(model, batch, context, ba.NUM_NODES, torch.device("cuda"),
                                       torch.Generator().manual_seed(0))

    def call():
        return ops.tree_attention(q, k, v, lens, mask, backend=backend)
    if variant in ba.PREFIX_TILE_VARIANTS:  # the first pass's own tile height
        rows = ba.PREFIX_TILE_VARIANTS[variant]
        return lambda: ba.attention_triton._tree_attention_triton(
            q, k, v, lens, mask, None, ba.NUM_NODES, prefix_block_m=rows)
    if variant is None:
        return call
    return lambda: with_constants(ba.attention_triton, ba.TRITON_VARIANTS[variant], call)


def _linear_call(backend: str, variant: str | None = None):
    """gate_proj at LINEAR_SHAPE; ``variant``: a bench_decoder.LINEAR_VARIANTS key or
    "fused_sum" (bench/kernels/linear_fused_sum.py)."""
    import torch
    import torch.nn.functional as F

    import bench_decoder as bd
    from common import with_constants
    from eagle_kernels import ops

    rows, n, k = LINEAR_SHAPE
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=gen).to("cuda", torch.bfloat16)
    w = torch.randn(n, k, generator=gen).div(k**0.5).to("cuda", torch.bfloat16)
    if backend == "cublas":
        return lambda: F.linear(x, w)

    def call():
        return ops.linear(x, w, backend=backend)
    if variant == "fused_sum":  # linear_fused_sum.py's experiment: no second launch
        return lambda: bd.linear_fused_sum(x, w)
    if variant is None:
        return call
    return lambda: with_constants(bd.decoder_triton, bd.LINEAR_VARIANTS[variant], call)


def _drafting_call(op: str, backend: str):
    """The acceptance / top-k bars' shapes (``op``: "chain" or "topk"), bf16 logits."""
    import torch

    from eagle_kernels import ops

    gen = torch.Generator().manual_seed(0)
    if op == "topk":
        logits = torch.randn(10, 32000, generator=gen).to("cuda", torch.bfloat16)
        return lambda: ops.topk_log_softmax(logits, 10, backend=backend)
    batch, nodes, vocab = CHAIN_SHAPE
    logits = torch.randn(batch, nodes, vocab, generator=gen).to("cuda", torch.bfloat16)
    draft = torch.softmax(torch.randn(batch, nodes - 1, vocab, generator=gen), -1).cuda()
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen).cuda()
    uniforms, bonus = torch.rand(batch, nodes, generator=gen).cuda(), torch.rand(batch).cuda()
    return lambda: ops.stochastic_accept_chain(tokens, draft, logits, uniforms, bonus,
                                               backend=backend)


# name -> a no-argument callable building the case's call (the tile variants' constants live in
# the benchmarks that time them: bench_attention.TRITON_VARIANTS, bench_decoder.LINEAR_VARIANTS)
CASES = {
    "attention_triton": lambda: _attention_call("triton"),
    "attention_triton_m64": lambda: _attention_call("triton", "triton_m64"),
    "attention_triton_pm64": lambda: _attention_call("triton", "triton_pm64"),
    "attention_triton_unordered": lambda: _attention_call("triton", "triton_unordered"),
    "attention_cuda": lambda: _attention_call("cuda"),
    "linear_triton": lambda: _linear_call("triton"),
    "linear_triton_m16": lambda: _linear_call("triton", "triton_m16"),
    "linear_triton_fused_sum": lambda: _linear_call("triton", "fused_sum"),
    "linear_cublas": lambda: _linear_call("cublas"),
    "chain_triton": lambda: _drafting_call("chain", "triton"),
    "chain_cuda": lambda: _drafting_call("chain", "cuda"),
    "topk_triton": lambda: _drafting_call("topk", "triton"),
}


def run_case(name: str) -> None:
    """Warm up, then one call of the case between cudaProfilerStart / Stop (what ncu sees)."""
    import torch

    os.environ.setdefault("EAGLE_KERNELS_CHECK_VALUES", "0")
    fn = CASES[name]()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def profile_case(name: str, out: Path, python: str) -> str:
    """ncu over one case into out/ncu-<name>.csv; '' or why it failed."""
    # --clock-control none: the GPU's own clocks, as the benchmarks ran (ncu locks base clocks
    # by default, which makes its durations incomparable with bench/kernels' times)
    command = ["ncu", "--target-processes", "all", "--profile-from-start", "off",
               "--clock-control", "none", "--csv", "--page", "details",
               *[arg for section in SECTIONS for arg in ("--section", section)],
               python, __file__, "--run", name]
    # its own process group: a timeout kills ncu and the python it runs (which holds the GPU)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"timed out after {CASE_TIMEOUT_S} s"
    (out / f"ncu-{name}.csv").write_text(stdout)
    (out / f"ncu-{name}.log").write_text(stderr)
    errors = [line for line in (stdout + stderr).splitlines() if line.startswith("==ERROR==")]
    if process.returncode != 0 or errors:
        return f"exit {process.returncode}: {' '.join(errors) or stderr[-300:]}"
    if not parse_ncu_csv(stdout, name):
        notes = " ".join(line for line in stdout.splitlines() if line.startswith("=="))
        return "no kernel profiled: " + notes[-300:]
    return ""


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _duration_us(value: float, unit: str) -> float:
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
             "s": 1e6, "second": 1e6}
    return value * scale.get(unit.strip().lower(), 1.0)


def parse_ncu_csv(text: str, case: str) -> list[dict]:
    """One row per profiled kernel launch of ncu's ``--csv --page details`` output."""
    # ncu's own lines (==PROF==, ==WARNING==) come before and among the table's quoted rows
    table = [line for line in text.splitlines() if line.startswith('"')]
    if not table or not table[0].startswith('"ID"'):
        return []
    launches: dict[str, dict] = {}
    wanted = {metric: column for column, metric in COLUMNS.items()}
    for record in csv.DictReader(table):
        launch = launches.setdefault(record.get("ID", ""), {
            "case": case, "kernel": re.split(r"[(<]", record.get("Kernel Name", "?"))[0].strip(),
            "grid": record.get("Grid Size", ""), "block": record.get("Block Size", "")})
        column = wanted.get(record.get("Metric Name", ""))
        value = _number(record.get("Metric Value", ""))
        if column is None or value is None or column in launch:
            continue
        if column.endswith("_pct") and record.get("Metric Unit", "%") != "%":
            continue  # e.g. MemoryWorkloadAnalysis's "Memory Throughput" in Gbyte/second
        if column == "duration_us":
            value = _duration_us(value, record.get("Metric Unit", "us"))
        launch[column] = round(value, 2)
    rows = list(launches.values())
    for row in rows:
        present = {c: row[c] for c in THROUGHPUTS if isinstance(row.get(c), float)}
        row["limiter"] = max(present, key=present.get).removesuffix("_pct") if present else ""
    return rows


def summarize(out: Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("ncu-*.csv")):
        rows += parse_ncu_csv(path.read_text(), path.stem.removeprefix("ncu-"))
    fields = ["case", "kernel", "grid", "block", *COLUMNS, "limiter"]
    with open(out / "profile.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        writer.writerows(rows)
    table = [" ".join(f"{f}={row.get(f, '')}" for f in fields) for row in rows]
    (out / "profile.txt").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="profile every case into this folder")
    parser.add_argument("--case", action="append", choices=sorted(CASES),
                        help="only this case (repeatable)")
    parser.add_argument("--run", choices=sorted(CASES), help="run one case (under ncu)")
    parser.add_argument("--summarize", type=Path, help="profile.csv from a folder's ncu-*.csv")
    args = parser.parse_args(argv)
    if args.run:
        run_case(args.run)
        return 0
    if args.summarize:
        summarize(args.summarize)
        return 0
    if args.out is None:
        parser.error("one of --out, --run, --summarize is required")
    if shutil.which("ncu") is None:
        print("ncu: not found (Nsight Compute is on the lent GPU machine)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    try:
        for name in args.case or CASES:
            why = profile_case(name, args.out, sys.executable)
            print(f"{name}: {why or 'ok'}", flush=True)
            failed += bool(why)
    finally:  # the stage's timeout interrupts: the cases profiled so far still make the table
        summarize(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
