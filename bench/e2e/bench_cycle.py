"""Cycle time of the speculative loop against one autoregressive step of the same runtime.

The issue-6 bar: Llama-3.1-8B shape with random weights, bf16, batch 1, context 1k, EAGLE-3
head (draft vocabulary 32000), tree total_tokens 60 / depth 7 / top_k 10: one cycle (draft +
verify + accept + compaction + commit) over one autoregressive step <= 1.5 (memory roofline
1.45 at context 1k, batch 1). Random weights accept nothing, so every cycle yields one token and
``cycle time = decode time / cycles`` exactly; the autoregressive step is timed the same way.

``--batches 1 8 32``: the same at several batch sizes (every sequence a random prompt of the
context's length); ``--budget-alpha A``: per (backend, batch), the tree the tree budget picks
(:func:`~eagle_kernels.runtime.tree_budget.choose_tree`: every candidate tree's cycle measured
at that batch, then the best at acceptance ``A``, a stated assumption: random weights accept
nothing) instead of the fixed 60-node tree.

Rows per (backend, context, batch): median cycle and step time over ``--repeats`` generate calls,
their ratio, the roofline ratio (a cycle's floor over a step's, each pass's floor the larger of
its bytes over the bandwidth and its matrix FLOPs over ``matmul_tflops``, a cuBLAS matmul timed
in the run: :func:`roofline_ratio`; bytes: target weights + KV once per pass, the head's weights
once per drafting step; of the untied embedding table a pass reads only its tokens' rows, left
out as bench/e2e/bench_cpu.py's ``step_bytes`` leaves them: 8 KB a token against 15 GB of
Llama-3.1-8B weights; bytes alone up to 2026-11-28's CSV), the step's achieved fraction
of the measured bandwidth (``floor_gbps``: the fastest of read, write and copy, as the kernel
floors take it; copy alone before 2026-11-28), whether CUDA-graph capture succeeded, and
where a cycle's time goes (:func:`phase_ms`: drafting and verifying alone, the rest of the
cycle by difference; since 2026-11-28's CSV). CSV + PNG. (The cycle CSVs of 2026-11-26/27
count the whole table per pass, 1.05 GB for Llama: roofline 1.42 for Llama and 2.17 for
SmolLM2, where these bytes give 1.45 and 2.39.)

    python bench/e2e/bench_cycle.py --out bench/results/local         # GPU
    python bench/e2e/bench_cycle.py --smoke --out /tmp/cycle          # anywhere, tiny shapes
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import linear_weights, step_bytes  # noqa: E402  (one definition each)
from common import (append_rows, graphed, matmul_tflops, memory_bandwidth, plot_rows,  # noqa: E402
                    time_fn)

from eagle_kernels.ops import BACKEND_ENV, op_backends  # noqa: E402
from eagle_kernels.runtime import Engine, TreeConfig  # noqa: E402
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head  # noqa: E402
from eagle_kernels.runtime.model import TargetModel  # noqa: E402
from eagle_kernels.runtime.tree_budget import choose_tree, cycle_calls  # noqa: E402

SHAPES = {
    "llama3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rope_theta=100000.0),
    "smoke": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
}


def random_target(shape: str, dtype: torch.dtype, device: torch.device) -> TargetModel:
    """A target of the named shape with N(0, 0.02) weights, built straight on the device."""
    from transformers import LlamaConfig

    config = LlamaConfig(**SHAPES[shape], tie_word_embeddings=False)
    with torch.device("meta"):
        model = TargetModel(config)
    model = model.to_empty(device=device).to(dtype)
    _randomise(model)
    from eagle_kernels.runtime.layers import RotaryEmbedding

    model.model.rotary_emb = RotaryEmbedding(config).to(device)
    return model.eval()


def _randomise(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, 0.02)


def weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def kv_bytes(target, context: int, batch: int) -> int:
    """The K and V cache bytes a pass over ``batch`` sequences of ``context`` keys reads."""
    config = target.config
    return (2 * batch * config.num_hidden_layers * config.num_key_value_heads
            * (config.hidden_size // config.num_attention_heads) * context
            * target.lm_head.weight.element_size())


def target_step_bytes(target, context: int, batch: int) -> int:
    """Bytes one autoregressive step must read: the target's weights as bench_cpu.step_bytes
    counts them (an untied embedding table is not read whole, only its tokens' rows) and the
    batch's KV once."""
    return step_bytes(target) + kv_bytes(target, context, batch)


def roofline_ratio(target, head, tree: TreeConfig, context: int, batch: int = 1,
                   bandwidth_gbps: float | None = None,
                   matmul_tflops: float | None = None) -> float:
    """The floor of one cycle over the floor of one autoregressive step.

    A pass's floor is the larger of the bytes it must read over the bandwidth and its matrix
    FLOPs (2 per linear weight per token; attention's left out) over the matmul rate, both
    measured in the run. The rate is what cuBLAS reaches on a large square matmul, not the
    datasheet's peak: a floor against the best library GEMM, which a kernel could beat only by
    outrunning cuBLAS (the bytes term is a hard floor; the FLOPs term a practical one). A step
    reads the target's weights and the batch's KV once (:func:`target_step_bytes`) for one
    token a sequence. A cycle's verify pass reads
    them once for ``total_tokens`` tokens a sequence; the head's fc runs once (the commit) and
    its layer and lm_head once per drafting pass: the commit and the root's logits (a token a
    sequence), ``depth`` expansion steps (``top_k`` tokens a sequence). The head embeds with
    the target's table (not a parameter of the head). Without rates (a CPU smoke run): bytes
    alone, as the cycle CSVs up to 2026-11-28 took it, which at batch 8 and more understates
    the verify pass (compute-bound there on an H200).
    """
    def floor(read: int, flops: float) -> float:
        if bandwidth_gbps is None or matmul_tflops is None:
            return float(read)
        return max(read / (bandwidth_gbps * 1e9), flops / (matmul_tflops * 1e12))

    step = target_step_bytes(target, context, batch)
    per_token = 2 * linear_weights(target)
    fc = head.fc.weight.numel()
    per_pass = weight_bytes(head) - weight_bytes(head.fc)
    head_flops = 2 * (linear_weights(head) - fc)
    cycle = (floor(step, per_token * batch * tree.total_tokens)
             + floor(weight_bytes(head.fc), 2 * fc * batch)
             + 2 * floor(per_pass, head_flops * batch)
             + tree.depth * floor(per_pass, head_flops * batch * tree.top_k))
    return cycle / floor(step, per_token * batch)


def time_generation(engine: Engine, prompts: list[list[int]], new_tokens: int,
                    speculative: bool, repeats: int) -> tuple[float, str]:
    """Median seconds per cycle over ``repeats`` generate calls, and the graph status."""
    per_cycle = []
    for _ in range(repeats):
        stats = engine.generate(prompts, new_tokens, speculative=speculative).stats
        per_cycle.append(stats.decode_seconds / max(stats.cycles, 1))
    return statistics.median(per_cycle), engine.graph_status


def phase_ms(target, head, tree: TreeConfig, context: int, batch: int) -> dict:
    """Where a cycle's time goes: drafting the tree and verifying it, each alone as the tree
    budget times them (:func:`~eagle_kernels.runtime.tree_budget.cycle_calls`), replayed from a
    CUDA graph where it captures (else eager, and ``phases_graph`` says why). The rest of a
    cycle (acceptance, compaction, the head's commit, the decode loop) is the cycle's time less
    both, given where the cycle and both phases ran from graphs alike."""
    device = target.device
    with torch.inference_mode():
        calls, status = list(cycle_calls(target, head, tree, context, batch)), "captured"
        if device.type == "cuda":
            try:
                calls = [graphed(call) for call in calls]
            except Exception as error:  # the torch reference syncs on the host: time it eagerly
                torch.cuda.synchronize(device)
                status = f"eager ({type(error).__name__})"
        else:
            status = "eager (no CUDA)"
        draft, verify = (time_fn(call, repeats=10, warmup=2, flush_l2=False,
                                 device=device).median_us / 1e3 for call in calls)
    return {"draft_ms": round(draft, 3), "verify_ms": round(verify, 3), "phases_graph": status}


def ops_off_torch(backend: str) -> str:
    """Which ops run on a GPU kernel under this EAGLE_KERNELS_BACKEND value: all of them when
    one is forced, else those this GPU's verdict put into auto (bench/results/*/verdict.json)."""
    if backend != "auto":
        return f"all ({backend} forced)"
    chosen = [f"{op}:{name}" for op, impls in op_backends().items()
              for name, how in impls.items() if name in ("cuda", "triton") and how == "auto"]
    return " ".join(chosen) or "none (no verdict for this GPU: torch reference)"


def _measure(target, head, tree, context, batch, args) -> dict:
    """One (backend, context, batch) row; a backend that fails records its error instead."""
    prompts = [torch.randint(0, target.vocab_size, (context,)).tolist() for _ in range(batch)]
    try:
        if args.budget_alpha is not None:
            tree = choose_tree(target, head, batch, context, args.budget_alpha,
                               repeats=3).current
        engine = Engine(target, head, tree)
        engine.prompt_lookup = False  # the head's cycle, every cycle (not context drafts)
        cycle, cycle_graph = time_generation(engine, prompts, args.new_tokens, True, args.repeats)
        step, step_graph = time_generation(engine, prompts, args.new_tokens, False, args.repeats)
        phases = phase_ms(target, head, tree, context, batch)
    except Exception as error:  # keep the other backends' rows
        return {"error": f"{type(error).__name__}: {error}"[:300]}
    if phases["phases_graph"] == cycle_graph == "captured":
        phases["rest_ms"] = round(cycle * 1e3 - phases["draft_ms"] - phases["verify_ms"], 3)
    return {"cycle": cycle, "step": step, "graph_cycle": cycle_graph, "graph_step": step_graph,
            "tree": tree, "phases": phases}


def random_cycle_model(shape: str, smoke: bool):
    """What a cycle is timed over: (device, dtype, shape name, tree, target, head), the GPU in
    bf16 where there is one, the tree 60 / depth 7 / top-k 10, random weights, an EAGLE-3 head
    with a 32000-token draft vocabulary; ``smoke``: tiny shapes and tree on the CPU."""
    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = "smoke" if smoke else shape
    tree = TreeConfig(top_k=4, depth=2, total_tokens=10) if smoke else TreeConfig(
        top_k=10, depth=7, total_tokens=60)
    target = random_target(shape, dtype, device)
    head = new_draft_head(EAGLE3, target, draft_vocab=None if smoke else 32000)
    _randomise(head)
    return device, dtype, shape, tree, target, head


def run(args) -> list[dict]:
    device, dtype, shape, tree, target, head = random_cycle_model(args.shape, args.smoke)
    # the rate the kernel floors divide by (common.floor_us): the fastest stream measured here
    rates = memory_bandwidth(device) if device.type == "cuda" else None
    bandwidth = rates.floor_gbps if rates is not None else float("nan")
    # the rate compute floors divide by (a large cuBLAS matmul in the run's dtype)
    tflops = matmul_tflops(device, dtype) if device.type == "cuda" else None
    rows = []
    picked = "fixed" if args.budget_alpha is None else f"budget at alpha {args.budget_alpha}"
    for backend in args.backends:
        os.environ[BACKEND_ENV] = backend
        for context, batch in ((c, b) for c in args.contexts for b in args.batches):
            measured = _measure(target, head, tree, context, batch, args)
            if "error" in measured:
                rows.append({"shape": shape, "backend": backend, "batch": batch,
                             "context": context, "ops_off_torch": ops_off_torch(backend),
                             **measured})
                print(rows[-1], flush=True)
                append_rows(Path(args.out) / "cycle.csv", rows[-1:])
                continue
            cycle, step, used = measured["cycle"], measured["step"], measured["tree"]
            roofline = roofline_ratio(target, head, used, context, batch,
                                      rates.floor_gbps if rates is not None else None, tflops)
            read = target_step_bytes(target, context, batch)
            rows.append({
                "shape": shape, "backend": backend, "batch": batch, "context": context,
                "total_tokens": used.total_tokens, "depth": used.depth, "top_k": used.top_k,
                "tree": picked,
                "dtype": str(dtype).replace("torch.", ""),
                "cycle_ms": round(cycle * 1e3, 3), "step_ms": round(step * 1e3, 3),
                "cycle_over_step": round(cycle / step, 3),
                **measured["phases"],
                "roofline_cycle_over_step": round(roofline, 3),
                "step_bw_fraction": round(read / step / 1e9 / bandwidth, 3)
                if bandwidth == bandwidth else "",
                **(rates.columns() if rates is not None else {}),
                "matmul_tflops": round(tflops, 1) if tflops is not None else "",
                "graph_cycle": measured["graph_cycle"], "graph_step": measured["graph_step"],
                "ops_off_torch": ops_off_torch(backend), "error": "",
            })
            print(rows[-1], flush=True)
            # row by row: a step cut short by its stage's budget keeps the rows it measured
            append_rows(Path(args.out) / "cycle.csv", rows[-1:])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/local")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    parser.add_argument("--shape", default="llama3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024])
    parser.add_argument("--backends", nargs="+", default=["auto", "triton"],
                        help="values of EAGLE_KERNELS_BACKEND to run (auto: what this GPU's "
                        "verdict proved, else the torch reference)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--budget-alpha", type=float, default=None,
                        help="the tree the tree budget picks at this acceptance, per batch "
                        "(default: the fixed 60-node tree)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.smoke:
        args.contexts, args.new_tokens, args.repeats = [16], 4, 1
        args.backends, args.batches = ["auto"], [1, 2]
    rows = run(args)
    out = Path(args.out)
    plot_rows([dict(row, series=f"{row['backend']} B={row['batch']}") for row in rows
               if not row.get("error")], "context", "cycle_over_step", "series", out / "cycle.png",
              "speculative cycle / autoregressive step (1.0 = free drafting)", logy=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
