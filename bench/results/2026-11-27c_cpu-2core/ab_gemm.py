"""In-process A/B of two builds of eagle_kernels._cpu's GEMM over SmolLM2-135M-shaped block
packs: an older build's .so against a newer one, alternating round by round (A B, then B A),
medians of per-round ratios.

    # each build: python setup.py build_ext --inplace, then copy eagle_kernels/_cpu*.so away
    python bench/results/2026-11-27c_cpu-2core/ab_gemm.py OLD.so NEW.so q4 1,2,4,8,16,64
    python bench/results/2026-11-27c_cpu-2core/ab_gemm.py OLD.so NEW.so q4 1,4,16 --layers 7
    python bench/results/2026-11-27c_cpu-2core/ab_gemm.py OLD.so NEW.so q8 1,2,4,8,16
    python bench/results/2026-11-27c_cpu-2core/ab_gemm.py OLD.so NEW.so q4 1,4,16 --isa avx2
    # one build (two copies of its .so: each copy its own process-wide modes), with activations
    # rounded to 0 (fp32) / 8 / 16 bits in each (ops.set_cpu_activations; later builds only)
    python bench/results/2026-11-27c_cpu-2core/ab_gemm.py A.so B.so q4 1,4,16 --bits 0,16

``q4``: the four GEMMs of each of ``--layers`` decoder layers (q / k / v fused, o, gate / up
fused, down: 3.54 M weights a layer) over random Q4 packs, called one after another as a decode
step calls them, repeated up to 30 layer calls (30 distinct layers: 80 MB, from DRAM as in a
decode step; 7: they stay in the 32 MB L3). ``q8``: the 49152 x 576 lm_head over a random Q8
pack (32 MB). Pack bytes are random with every block scale 0.01: both builds read the same
bytes whatever their format's meaning (times do not depend on values; the builds before block
packs read the first 128 bytes of a Q4 block as two scale vectors too, and the rest as rows).
The builds are loaded under other module names (as ``eagle_kernels._cpu``, Python would hand
back the module already imported). Two threads, as the runtime's default on this machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

LAYER = (((576, 576), (192, 576), (192, 576)), ((576, 576),), ((1536, 576), (1536, 576)),
         ((576, 1536),))  # (n, k) per fused GEMM of a SmolLM2-135M layer
LM_HEAD = (((49152, 576),),)
BLOCK_BYTES = {"q4": 384, "q8": 576}
SCALE_BYTES = {"q4": 128, "q8": 64}
FORMAT_TAG = {"q4": 2, "q8": 3}  # kernels.h PackFormat, in a pack address's low bits
DECODE_LAYERS = 30


def load_build(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_build._cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_pack(n: int, k: int, fmt: str) -> torch.Tensor:
    pack = torch.randint(0, 256, (n // 16, k // 32, BLOCK_BYTES[fmt]), dtype=torch.uint8)
    scales = SCALE_BYTES[fmt]
    pack[:, :, :scales] = torch.full((n // 16, k // 32, scales // 4), 0.01).view(torch.uint8)
    return pack


def gemm_calls(fmt: str, layers: int, rows: int):
    groups = LAYER * layers if fmt == "q4" else LM_HEAD
    calls = []
    for group in groups:
        k = group[0][1]
        x = torch.randn(rows, k)
        segments, held = [], [x]
        for n, _ in group:
            pack, y = random_pack(n, k, fmt), torch.empty(rows, n)
            held += [pack, y]
            segments += [pack.data_ptr() | FORMAT_TAG[fmt], 0, y.data_ptr(), n, n]
        calls.append((x, k, segments, held))
    repeat = max(1, DECODE_LAYERS // layers) if fmt == "q4" else 1
    return calls * repeat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("older")
    parser.add_argument("newer")
    parser.add_argument("format", choices=("q4", "q8"))
    parser.add_argument("rows", help="comma-separated row counts")
    parser.add_argument("--layers", type=int, default=DECODE_LAYERS)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isa", help="run both builds' kernels for this instruction set "
                        "(avx512, avx2, generic; default: the best the processor has)")
    parser.add_argument("--bits", help="OLDER,NEWER: activation bits of each build's Q4 / Q8 "
                        "GEMMs (0 fp32, 8, 16: _cpu.set_activation_bits, linear_int8.h)")
    args = parser.parse_args()
    builds = {"older": load_build(args.older, "older"), "newer": load_build(args.newer, "newer")}
    if args.bits:
        for module, bits in zip(builds.values(), args.bits.split(",")):
            module.set_activation_bits(int(bits))
    if args.isa:
        for module in builds.values():
            module.set_isa(args.isa)
    for rows in (int(r) for r in args.rows.split(",")):
        calls = gemm_calls(args.format, args.layers, rows)

        def run(module):
            for x, k, segments, _ in calls:
                module.linear(x.data_ptr(), rows, k, k, segments, args.threads)

        times = {name: [] for name in builds}
        for round_ in range(args.rounds):
            order = list(builds) if round_ % 2 == 0 else list(builds)[::-1]
            for name in order:
                run(builds[name])  # warm: the other build's calls ran last
                start = time.perf_counter()
                for _ in range(5):
                    run(builds[name])
                times[name].append((time.perf_counter() - start) / 5 * 1e3)
        ratios = [b / a for a, b in zip(times["older"], times["newer"])]
        isa = (f" {args.isa}" if args.isa else "") + (f" bits {args.bits}" if args.bits else "")
        print(f"{args.format}{isa} layers {args.layers} rows {rows}: older "
              f"{statistics.median(times['older']):.3f} ms, newer "
              f"{statistics.median(times['newer']):.3f} ms, newer / older median of per-round "
              f"ratios {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
              f"max {max(ratios):.3f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
