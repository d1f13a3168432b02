"""Where a speculative cycle's device time goes, kernel by kernel: torch.profiler over the two
calls a cycle makes (drafting, verifying: :func:`~eagle_kernels.runtime.tree_budget.cycle_calls`)
and one plain decoding step, at bench_cycle.py's shapes (random weights, its tree 60 / 7 / 10),
so a missed cycle bar names the kernels that cost it.

    python bench/e2e/trace_cycle.py --shape llama3.1-8b --out DIR     # GPU
    python bench/e2e/trace_cycle.py --smoke --out DIR                 # anywhere, tiny shapes

Per phase (draft, verify, step): each kernel's launches and device time per call, its share of
the phase, the phase's kernel and copy time in all (memcpy / memset apart), and the phase's time
replayed from a CUDA graph (as the runtime runs it). The profiler runs the calls eagerly (a
replayed graph's kernels are not seen by every CUPTI) with value checks off and weights
unchanged, as a capture and the loop run them (ops/_validate.py): the eager kernel sum is what
the replay launches, assuming a kernel takes as long in both; replay minus that sum (launch
gaps, idle SMs) is an estimate on that assumption, not a measurement. (The first run,
2026-11-28b_nvidia-h200, profiled with the checks on: its eager kernels include their scans and
DtoH copies, which a replay does not run.) Off a GPU the rows are the host's operators by self
time (the code path, not a measurement). Writes ``trace.csv`` (every kernel) and ``trace.txt``
(the phases and the top kernels of each).
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import sys
from pathlib import Path

import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cycle import SHAPES, random_cycle_model  # noqa: E402  (the same model)
from common import graphed, time_fn  # noqa: E402

from eagle_kernels.ops import BACKEND_ENV, weights_unchanged  # noqa: E402
from eagle_kernels.ops._validate import no_value_checks  # noqa: E402
from eagle_kernels.runtime.tree_budget import _step_call, cycle_calls  # noqa: E402

PROFILED_CALLS = 3  # per phase; device times are divided by it
TOP_KERNELS = 15  # per phase in trace.txt
NAME_CHARS = 110  # of a kernel's name in trace.txt (trace.csv keeps it whole)
COPIES = ("Memcpy", "Memset")  # device activity that is no kernel launch


def kernel_times(call, device: torch.device) -> dict[str, list[float]]:
    """{kernel name: [launches, microseconds]} per call of ``call``: device kernels on a GPU,
    host operators by self time elsewhere."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(2):  # compile / autotune outside the profile
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(PROFILED_CALLS):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    wanted = DeviceType.CUDA if device.type == "cuda" else DeviceType.CPU
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for event in profile.events():
        if event.device_type != wanted:
            continue
        micros = (event.time_range.elapsed_us() if wanted == DeviceType.CUDA
                  else event.self_cpu_time_total)
        totals[event.name][0] += 1 / PROFILED_CALLS  # whole names: instantiations apart
        totals[event.name][1] += micros / PROFILED_CALLS
    return dict(totals)


def replay_us(call, device: torch.device) -> float | str:
    """The call's median time replayed from a CUDA graph ('' where it does not capture)."""
    if device.type != "cuda":
        return ""
    try:
        replay = graphed(call)
    except Exception:  # noqa: BLE001  (a host sync: the phase has no graph time)
        torch.cuda.synchronize(device)
        return ""
    return round(time_fn(replay, repeats=20, warmup=3, flush_l2=False, device=device)
                 .median_us, 1)


def trace(args) -> tuple[list[dict], list[dict]]:
    os.environ[BACKEND_ENV] = args.backend
    device, _, shape, tree, target, head = random_cycle_model(args.shape, args.smoke)
    kernels, phases = [], []
    # as the loop runs (and a captured graph: no content scans, no host syncs)
    with torch.inference_mode(), weights_unchanged(), no_value_checks():
        draft, verify = cycle_calls(target, head, tree, args.context, 1)
        calls = {"draft": draft, "verify": verify, "step": _step_call(target, args.context, 1)}
        for phase, call in calls.items():
            times = kernel_times(call, device)
            total = sum(micros for _, micros in times.values())
            copies = {name: entry for name, entry in times.items() if name.startswith(COPIES)}
            for name, (launches, micros) in sorted(times.items(), key=lambda kv: -kv[1][1]):
                kernels.append({"phase": phase, "kernel": name, "launches": round(launches, 2),
                                "us": round(micros, 2),
                                "share": round(micros / total, 4) if total else 0.0})
            copy_us = sum(micros for _, micros in copies.values())
            phases.append({"phase": phase, "kernel_us": round(total - copy_us, 1),
                           "copy_us": round(copy_us, 1),
                           "launches": round(sum(n for name, (n, _) in times.items()
                                                 if name not in copies)),
                           "graph_us": replay_us(call, device)})
    for row in phases:
        row.update(shape=shape, backend=args.backend, context=args.context,
                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    return kernels, phases


def write(kernels: list[dict], phases: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "trace.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(kernels[0]))
        writer.writeheader()
        writer.writerows(kernels)
    lines = []
    for row in phases:
        graph = row["graph_us"]
        rest = (f", graph replay {graph} us (replay - eager sum: "
                f"{graph - row['kernel_us'] - row['copy_us']:.1f} us)" if graph else "")
        lines.append(f"== {row['phase']} ({row['shape']}, {row['backend']}, context "
                     f"{row['context']}, {row['device']}): {row['launches']} launches, kernels "
                     f"{row['kernel_us']} us, copies {row['copy_us']} us{rest}")
        top = [k for k in kernels if k["phase"] == row["phase"]][:TOP_KERNELS]
        lines += [f"  {k['us']:9.1f} us {100 * k['share']:5.1f} % x{k['launches']:<6g} "
                  f"{k['kernel'][:NAME_CHARS]}" for k in top]
    (out / "trace.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/local/trace")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    parser.add_argument("--shape", default="llama3.1-8b",
                        choices=sorted(name for name in SHAPES if name != "smoke"))
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--backend", default="auto",
                        help="EAGLE_KERNELS_BACKEND while tracing (auto: this GPU's verdict)")
    args = parser.parse_args()
    if args.smoke:
        args.context = 16
    write(*trace(args), Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
