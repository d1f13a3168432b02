"""Shared timing, bookkeeping and plotting for the per-op-family kernel benchmarks.

Every benchmark script in this folder (``bench_<family>.py``) times each backend of an op with
:func:`time_fn`, reports medians over repeats next to the torch reference measured in the same
run, expresses speed against its memory floor (:func:`floor_us`: the bytes it must move,
``op_bytes.py``, over the fastest bandwidth :func:`memory_bandwidth` measured in the run), and
appends rows to a CSV with :func:`append_rows` (device, versions, date and commit are added to
every row), then draws PNGs with :func:`plot_rows`. On a machine without a GPU the scripts run
in a tiny ``--smoke`` configuration so CI can prove they work; the numbers that matter come
from a GPU run (``bench/gpu_suite.sh``).
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch

L2_FLUSH_BYTES = 256 << 20  # larger than the L2 of an H100 (50 MB) or H200


class Timing(NamedTuple):
    """Per-call time in microseconds: median and the 20th / 80th percentiles of the repeats."""

    median_us: float
    p20_us: float
    p80_us: float
    repeats: int


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def _summarise(samples_us: list[float]) -> Timing:
    ordered = sorted(samples_us)
    return Timing(statistics.median(ordered), _percentile(ordered, 0.2),
                  _percentile(ordered, 0.8), len(ordered))


def time_fn(fn: Callable[[], object], *, repeats: int = 50, warmup: int = 5,
            flush_l2: bool = True, device: torch.device | str | None = None) -> Timing:
    """Time ``fn()``; CUDA events on a GPU (L2 flushed before each repeat), perf_counter on CPU."""
    device = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        return _summarise(samples)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device) if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    torch.cuda.synchronize(device)
    for start, end in zip(starts, ends):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return _summarise([start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)])


def graphed(fn: Callable[[], object]) -> Callable[[], None]:
    """Capture ``fn`` in a CUDA graph and return its replay: times a tiny kernel without the
    Python and launch overhead around it (what the runtime sees under graphs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up (compile / load kernels) outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def with_constants(module, constants: dict, fn: Callable[[], object]):
    """fn() with ``module``'s constants set to ``constants`` (restored after): a kernel's tile
    variant, timed beside the shipped one. A CUDA graph captures the kernels launched inside,
    so its replays keep the variant."""
    saved = {name: getattr(module, name) for name in constants}
    try:
        for name, value in constants.items():
            setattr(module, name, value)
        return fn()
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _stream_gbps(fn: Callable[[], object], moved_bytes: int, device) -> float:
    """GB/s of ``fn`` moving ``moved_bytes`` (a buffer far larger than L2: no flush needed)."""
    timing = time_fn(fn, repeats=20, flush_l2=False, device=device)
    return moved_bytes / (timing.median_us * 1e-6) / 1e9


def copy_bandwidth(device: torch.device | str = "cuda", megabytes: int = 1024) -> float:
    """Measured device-to-device copy bandwidth in GB/s (bytes read + written per second)."""
    # Random bytes: pages never written (or of repeated content) can be served faster than
    # real data on some machines (a VM read a buffer of ones at twice the rate of random ones).
    source = torch.randint(0, 256, (megabytes << 20,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return _stream_gbps(lambda: target.copy_(source), 2 * source.numel(), device)


class Bandwidth(NamedTuple):
    """Memory bandwidths in GB/s measured in one run (:func:`memory_bandwidth`): a copy (bytes
    read + written per second), a read-only reduction and a write-only fill."""

    copy_gbps: float
    read_gbps: float
    write_gbps: float

    @property
    def floor_gbps(self) -> float:
        """The rate every floor divides by: the fastest of the three (see :func:`floor_us`)."""
        return max(self.copy_gbps, self.read_gbps, self.write_gbps)

    def columns(self) -> dict:
        """The CSV columns that say which rate a row's floor used."""
        return {"floor_gbps": round(self.floor_gbps, 3), "read_gbps": round(self.read_gbps, 3),
                "write_gbps": round(self.write_gbps, 3), "copy_gbps": round(self.copy_gbps, 3)}

    def __str__(self) -> str:
        return (f"floor bandwidth {self.floor_gbps:.0f} GB/s (read {self.read_gbps:.0f}, write "
                f"{self.write_gbps:.0f}, copy {self.copy_gbps:.0f} GB/s)")


def memory_bandwidth(device: torch.device | str = "cuda", megabytes: int = 1024) -> Bandwidth:
    """Copy (:func:`copy_bandwidth`), read and write bandwidth over ``megabytes`` buffers (far
    larger than L2), each timed as the copy always was: CUDA events, 5 warm-up calls, the median
    of 20. Read: a float32 sum (a read stream; random values, no NaN or denormal to slow a
    CPU); write: a fill of the summed buffer. HBM reads run a few % to ~10 % faster than a copy,
    which is what most of these kernels do (read logits, a KV cache, weights)."""
    copy = copy_bandwidth(device, megabytes)
    values = torch.rand(megabytes << 18, device=device)  # megabytes MiB of float32
    moved = values.numel() * values.element_size()
    read = _stream_gbps(lambda: values.sum(), moved, device)
    write = _stream_gbps(lambda: values.fill_(0.5), moved, device)
    return Bandwidth(copy, read, write)


def matmul_tflops(device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
                  size: int = 8192) -> float:
    """Measured dense matmul rate in TFLOP/s: torch's [size x size] @ [size x size] in
    ``dtype`` (cuBLAS on a GPU), timed as the bandwidths are (CUDA events, 5 warm-up calls, the
    median of 20). The rate compute floors divide by: what the device's best library GEMM
    reaches, not the datasheet's peak (so such a floor is cuBLAS's, not the hardware's)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    timing = time_fn(lambda: a @ b, repeats=20, flush_l2=False, device=device)
    return 2 * size ** 3 / (timing.median_us * 1e-6) / 1e12


def floor_us(moved_bytes: float, bandwidth: Bandwidth) -> float:
    """The memory floor in microseconds of a call that must move ``moved_bytes`` (read plus
    written, each at least once; op_bytes.py): every benchmark row's floor is this.

    floor = (bytes read + bytes written) / max(read, write, copy bandwidth measured in the run).
    A lower bound on the time: HBM's data bus carries reads and writes in turn, so no mix of
    them moves bytes faster than the fastest pure stream (reads / read rate + writes / write
    rate >= their sum / the faster rate), and a copy measured faster only lowers the floor.
    Not reads / read + writes / copy: a copy's rate averages its reads and writes, so writes
    over it could overstate a write stream's time, and the floor would no longer bound."""
    return moved_bytes / (bandwidth.floor_gbps * 1e3)


def _git_commit() -> str:
    """HEAD here, or EAGLE_COMMIT when set (a lent GPU's .git can be older than the tree it
    was sent: bench/stages/lib.sh)."""
    if os.environ.get("EAGLE_COMMIT"):
        return os.environ["EAGLE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict[str, str]:
    """Device, library versions, date and commit: added to every CSV row."""
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return {"device": device, "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "triton": triton_version, "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": _git_commit()}


@contextlib.contextmanager
def written_if_interrupted(write: Callable[[], None]):
    """Run the block; if the stage step's timeout interrupts it (SIGINT, bench/stages/lib.sh),
    call ``write`` (the rows timed so far) and exit 130: a family cut short still hands the
    verdict the rows it timed, where it used to write none (no rows, no speedup, no ``auto``)."""
    try:
        yield
    except KeyboardInterrupt:
        write()
        print("interrupted: the rows timed so far are written", flush=True)
        raise SystemExit(130) from None


def append_rows(csv_path: str | os.PathLike, rows: list[dict]) -> None:
    """Append ``rows`` (dicts with the same keys) plus :func:`environment` columns to a CSV."""
    if not rows:
        return
    extra = environment()
    rows = [{**row, **extra} for row in rows]
    path = Path(csv_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    if path.exists():
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            if any(column not in header for column in columns):
                # new columns (another step's rows, an error row): rewrite under their union
                rows = list(reader) + rows
                header += [column for column in columns if column not in header]
                path.unlink()
        columns = header
    new_file = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        if new_file:
            writer.writeheader()
        writer.writerows(rows)


def plot_rows(rows: list[dict], x: str, y: str, series: str, png_path: str | os.PathLike,
              title: str, logx: bool = True, logy: bool = True) -> None:
    """One line per value of ``series``: ``y`` against ``x``; saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name in sorted({str(row[series]) for row in rows}):
        points = sorted((float(row[x]), float(row[y])) for row in rows if str(row[series]) == name)
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    axes.set_xscale("log" if logx else "linear")
    axes.set_yscale("log" if logy else "linear")
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=120)
    plt.close(figure)


def plot_bars(rows: list[dict], group: str, series: str, y: str, png_path: str | os.PathLike,
              ylabel: str, baseline: float | None = None) -> None:
    """Grouped bars: one group per value of ``group`` (sorted), one bar per value of ``series``
    (in the rows' order) of height ``y``; a grey line at ``baseline``; saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({row[group] for row in rows})
    names = list(dict.fromkeys(row[series] for row in rows))
    figure, axes = plt.subplots(figsize=(6.5, 3.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        heights = [next(float(r[y]) for r in rows if r[group] == g and r[series] == name)
                   for g in groups]
        axes.bar([k + i * width for k in range(len(groups))], heights, width, label=name)
    if baseline is not None:
        axes.axhline(baseline, color="grey", lw=0.8)
    axes.set_xticks([k + (len(names) - 1) * width / 2 for k in range(len(groups))], groups)
    axes.set_ylabel(ylabel)
    axes.legend(fontsize=8)
    figure.tight_layout()
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=120)
    plt.close(figure)


def launch_us(device: torch.device | str) -> float:
    """One graphed launch of a trivial kernel, timed as the kernels are (behind an L2 flush, so
    the GPU waits on nothing the host does): the fixed cost every graphed kernel pays. 0 off a
    GPU. Unflushed back-to-back replays time the host's enqueue instead (~17 us on an H200,
    more than most of these kernels take)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0.0
    x = torch.zeros(1, device=device)
    return time_fn(graphed(lambda: x.add_(1)), device=device).median_us


def timing_columns(timing: Timing, baseline: Timing | None, floor_us: float,
                   launch: float | None = None) -> dict:
    """The columns every benchmark row carries: median and spread, speedup over the torch
    reference timed in the same run (blank when it was not timed), and the memory-bound floor
    (``x_floor`` = time / floor, 1.0 is the roofline; ``floor_fraction`` = floor / time, the
    fraction of the roofline reached). ``launch`` (an empty graphed kernel, :func:`launch_us`)
    adds ``launch_us`` and ``x_launch_floor`` = time / (launch + floor). ``floor_note`` flags a
    row faster than its floor (or than launch + floor): the bytes, the rate or the launch behind
    it are off, never a kernel beating physics. Every kernel CSV also has ``op``, ``backend``
    and ``dtype`` columns: bench/verdict.py reads the speedups by them."""
    median = timing.median_us
    columns = {"median_us": round(median, 3), "p20_us": round(timing.p20_us, 3),
               "p80_us": round(timing.p80_us, 3), "repeats": timing.repeats,
               "speedup_vs_torch": round(baseline.median_us / median, 2) if baseline else "",
               "floor_us": round(floor_us, 3), "x_floor": round(median / floor_us, 2),
               "floor_fraction": round(floor_us / median, 3)}
    under = [f"below its floor ({floor_us:.3g} us)"] if median < floor_us else []
    if launch is not None:
        columns["launch_us"] = round(launch, 3)
        columns["x_launch_floor"] = round(median / (launch + floor_us), 2)
        if floor_us <= median < launch + floor_us:
            under.append(f"below launch + floor ({launch + floor_us:.3g} us)")
    columns["floor_note"] = "; ".join(under)
    return columns


def bench_arguments(description: str):
    """(args, device) of every kernel benchmark: ``--out DIR`` for the CSV/PNG files and
    ``--smoke`` for tiny sizes that run anywhere (CPU numbers mean nothing)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default="bench/results/local", help="CSV / PNG directory")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, < 60 s on a CPU")
    args = parser.parse_args()
    return args, torch.device("cuda" if torch.cuda.is_available() else "cpu")
