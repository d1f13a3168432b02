"""In-process A/B of two builds of eagle_kernels._cpu: an older build's .so against the installed
one, alternating round by round (A B, then B A), medians of per-round ratios.

    # the older build: e.g. `git stash; python setup.py build_ext --inplace --force`, copy
    # eagle_kernels/_cpu*.so to /tmp/old/, `git stash pop`, build again
    python bench/results/2026-11-27b_cpu-2core/ab_builds.py /tmp/old/_cpu*.so attention 256,2048
    python bench/results/2026-11-27b_cpu-2core/ab_builds.py /tmp/old/_cpu*.so forward 256,1024 --nodes 16

``attention``: ops.tree_attention of one decode query over 30 layers' SmolLM2-shaped caches (3
KV heads x 64, fp32, random values), each layer's caches its own (so they come from DRAM as in a
decode step). ``forward``: the default target's forward over ``--nodes`` tokens (a random
EAGLE-like tree) after the given context, as bench_cpu.py's verify / AR step time it.

The older build is loaded under another module name: loaded as ``eagle_kernels._cpu``, Python
hands back the module already imported, and both sides would run the same code.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "e2e"))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

from eagle_kernels import ops  # noqa: E402
import eagle_kernels.ops._backend as backend  # noqa: E402
import eagle_kernels.ops.attention as attention  # noqa: E402
import eagle_kernels.ops.decoder as decoder  # noqa: E402
import eagle_kernels.ops.layer as layer  # noqa: E402
from eagle_kernels.ops._validate import no_value_checks  # noqa: E402

LAYERS = 30


def load_build(path: str):
    spec = importlib.util.spec_from_file_location("older_build._cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use(extension) -> None:
    for module in (attention, decoder, layer):
        module.cpu_extension = lambda e=extension: e


def attention_call(context: int, _nodes: int):
    generator = torch.Generator().manual_seed(context)
    shape = (1, context + 1, 3, 64)
    keys = [torch.randn(shape, generator=generator) for _ in range(LAYERS)]
    values = [torch.randn(shape, generator=generator) for _ in range(LAYERS)]
    q = torch.randn(1, 1, 9, 64, generator=generator)
    lens = torch.tensor([context], dtype=torch.int32)
    mask = torch.ones(1, 1, 1, dtype=torch.int32)

    def run():
        for k, v in zip(keys, values):
            ops.tree_attention(q, k, v, lens, mask, backend="cpu")
    return run


def forward_call(target):
    import bench_cpu

    def make(context: int, nodes: int):
        cache = target.allocate_cache(1, context + nodes)
        cache.lens.fill_(context)
        for tensor in cache.keys + cache.values:
            tensor.normal_()
        depth, mask = bench_cpu.random_tree(nodes, torch.Generator().manual_seed(1))
        tokens = torch.zeros(1, nodes, dtype=torch.int64)
        positions = context + depth.to(torch.int64)
        return lambda: target(tokens, positions, cache, mask)
    return make


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("older", help="the older build's _cpu .so")
    parser.add_argument("what", choices=("attention", "forward"))
    parser.add_argument("contexts", help="comma-separated context lengths")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=10, help="timed calls per round and side")
    args = parser.parse_args()
    builds = {"older": load_build(args.older), "installed": backend.cpu_extension()}
    if args.what == "forward":
        from eagle_kernels.runtime.api import from_pretrained

        make = forward_call(from_pretrained(tree="auto").engine.target)
    else:
        make = attention_call
    with torch.inference_mode(), no_value_checks(), ops.weights_unchanged():
        for context in (int(c) for c in args.contexts.split(",")):
            call, times = make(context, args.nodes), {name: [] for name in builds}
            for round_ in range(args.rounds):
                order = list(builds) if round_ % 2 == 0 else list(builds)[::-1]
                for name in order:
                    use(builds[name])
                    call()  # warm: the other build's call ran last
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        call()
                    times[name].append((time.perf_counter() - start) / args.calls * 1e3)
            ratios = [b / a for a, b in zip(times["older"], times["installed"])]
            print(f"{args.what} context {context} nodes {args.nodes}: older "
                  f"{statistics.median(times['older']):.3f} ms, installed "
                  f"{statistics.median(times['installed']):.3f} ms, installed / older median "
                  f"of per-round ratios {statistics.median(ratios):.3f} "
                  f"(min {min(ratios):.3f}, max {max(ratios):.3f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
