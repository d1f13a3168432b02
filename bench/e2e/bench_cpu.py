"""The CPU fast path against its floors and its baselines, measured in one run.

    python bench/e2e/bench_cpu.py --out bench/results/<date>_cpu-2core      # ~10 min, 2 cores
    python bench/e2e/bench_cpu.py --smoke                                   # seconds, CI

On the default target (SmolLM2-135M-Instruct, fp32, batch 1, context 256) with the bundled
EAGLE-3 head, every ratio against something measured in the same process, and every
measurement below (floors included) timed in the same interleaved rounds, medians over
``--repeats``, so the machine's drift cannot favour one of them:

* floors (physical: bytes / measured bandwidth, FLOPs / measured rate): read bandwidth, the
  faster of DRAM's (a 1 GiB reduction and our GEMV over 1 GiB) and that of a buffer of the
  step's own bytes read again and again as decoding reads its weights (the same two calls, in
  a row: a last-level cache that holds it serves it faster; on an Intel VM with a 260 MB L3,
  `2026-11-29d`, 53.3 GB/s against DRAM's 25.2; the long contexts' rows read more bytes and
  keep this bandwidth, a floor that can only be too low) -> memory floor = (bytes of the
  weights a decode step reads, as the kernels store them: the target's layers are exact 4-bit
  Q4_1 packs, the fp32 floor reported beside; + the K / V rows its attention reads, fp32
  cache: context x layers x 2 x kv width x 4 bytes) / bandwidth; GEMM rate on an in-cache
  matrix (the faster of torch's matmul and ours, [64 x 1536] x [1536 x 576]) -> compute
  floor(N) = FLOPs of N tokens / that rate; a row's floor is max(memory, compute floor(N));
* ``ar_step``: one autoregressive step as the engine runs it (target + logits + argmax, inside
  ``ops.weights_unchanged()`` as the engine's loop, timed in a row after steps run back to
  back for SETTLE_SECONDS, as decoding runs them: InARow), against its floor; and
  (``floors``, not a floor: our own kernels' speed) against the step's one-row GEMVs timed
  over in-cache weights (one_row_calls): what our GEMV needs with no DRAM in the way;
* ``ar_step_long``: the same step after 1024 and 2048 tokens of context: what longer chats
  cost;
* ``verify`` for N = 1..64 tree nodes (a random EAGLE-like tree's real packed mask, also
  timed in a row): against the AR step and against its floor;
* ``draft``: drafting as a cycle runs it (head forwards, top-k, expand, rerank) per candidate
  tree, per step against the AR step;
* end to end (unless ``--no-e2e``): bench_e2e.py's four methods (ours-EAGLE with the adaptive
  tree, ours-AR, transformers greedy, transformers prompt lookup) on held-out ShareGPT and
  HumanEval prompts, outputs checked identical.

Writes ``cpu.csv`` (one row per measurement, with device / versions / date / commit),
``cpu.json``, ``cpu.png`` (verify(N) against the floors), and the e2e files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_rows, environment  # noqa: E402

from eagle_kernels import ops  # noqa: E402
from eagle_kernels.ops._validate import no_value_checks  # noqa: E402
from eagle_kernels.runtime.layers import head_dim_of  # noqa: E402
from eagle_kernels.runtime.tree_budget import (CANDIDATE_TREES, SETTLE_SECONDS,  # noqa: E402
                                               cycle_calls, interleaved_medians, settle_steps)

VERIFY_NODES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
# AR steps and verify passes run back to back per round, untimed for SETTLE_SECONDS (the tree
# budget's, at least once), then STEPS_IN_A_ROW times timed (their mean; medians over rounds):
# a decoding loop runs step after step, and one step timed right after the round's other calls
# ran 18 % slower than each of 8 in a row (4.5 against 3.7 ms; the engine's own loop timed 3.9
# ms then); after a 6/4/16 cycle steps took ~15-18 steps (~80-90 ms) to come back from 6.7 to
# 4.7 ms (2026-11-29d, Intel VM), so three warm-up steps were not enough. A cycle's drafting stays
# timed once, after the call before it: in a cycle it follows the target's weight stream, which
# evicts the head's weights; drafting again and again would find them in L3.
STEPS_IN_A_ROW = 4
LONG_CONTEXTS = (1024, 2048)  # ar_step_long


# The in-cache GEMM is timed this many times per call: the call before it streams the weights
# from DRAM and evicts the GEMM's 3.9 MB, and one cold pass would then count ~10 % of the time.
GEMM_PASSES = 8


def bandwidth_calls(megabytes: int) -> tuple[int, list]:
    """Bytes, and two calls that each read them: a torch reduction over a buffer and our
    one-row GEMM over a weight of the same size (1 GiB: from DRAM; the step's own bytes: from
    wherever re-reading them comes from). The faster gives the bandwidth, so the floor is never
    flattered by a slow way of reading.

    The buffer holds random values, as weights do: this VM's memory serves pages of repeated
    content faster (our GEMV read a 1 GiB buffer of ones at 66 GB/s and one of random values at
    33 GB/s, side by side), and a floor measured on ones would be one no real weight can reach."""
    data = torch.rand(megabytes << 18, generator=torch.Generator().manual_seed(0))  # MiB fp32
    weight = data.view(-1, 1024)
    x = torch.ones(1, 1024)
    return data.numel() * 4, [lambda: data.sum(), lambda: ops.linear(x, weight)]


def gemm_calls(packed_weight: torch.Tensor | None = None) -> tuple[float, list]:
    """FLOPs, and torch's and our GEMM on an in-cache [64 x 1536] x [1536 x 576] (GEMM_PASSES
    times per call), and ours over ``packed_weight`` (a [576 x 1536] weight of the target, as
    the target packs it: Q4 blocks, with quantized activations when they are on): the fastest
    gives the GEMM rate."""
    x, w = torch.randn(64, 1536), torch.randn(576, 1536)
    wt = w.t().contiguous()
    ours = [lambda: ops.linear(x, w)]
    if packed_weight is not None:
        ours.append(lambda: ops.linear(x, packed_weight))

    def passes(gemm):
        def call():
            for _ in range(GEMM_PASSES):
                gemm()
        return call

    return (2 * 64 * 1536 * 576 * GEMM_PASSES,
            [passes(lambda: x @ wt)] + [passes(gemm) for gemm in ours])


def one_row_calls(target) -> tuple[list[float], list]:
    """How many times each call's time counts in a decode step, and two calls that run one-row
    GEMVs over in-cache weights (GEMM_PASSES times each): the first layer's, grouped as the
    fused layer calls them (q/k/v, o, gate/up, down: its packs, ~2.7 MB, stay in L2 / L3
    between passes; counts layers / GEMM_PASSES), and a [6144 x 576] slice of the lm_head,
    packed as the lm_head is (~4 MB; counts lm_head / slice / GEMM_PASSES). Their weighted sum
    is what our GEMVs need for a decode step with no DRAM in the way (one row reuses no weight
    across rows, so a GEMV runs below the many-row GEMM rate of the compute floor(N); over
    4-bit packs it is bound by turning levels into fp32). Our kernels' speed, not a physical
    floor: reported beside the floors, never as one. No calls where the cpu kernels are not
    built."""
    if not ops.available_backends()["cpu"].available:
        return [], []
    from eagle_kernels.ops._backend import cpu_extension
    from eagle_kernels.ops.decoder import _PACKS, pack_address

    layer = target.model.layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    groups = [[attention.q_proj, attention.k_proj, attention.v_proj], [attention.o_proj],
              [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]]
    groups = [[m.weight for m in group] for group in groups]
    head = target.lm_head.weight
    head_slice = head[:min(6144, head.shape[0])]  # contiguous rows: packed as the lm_head is
    extension, held = cpu_extension(), []

    def gemvs(weight_groups):
        """The kernel calls themselves, one per group as the fused layer makes them (ops.linear's
        ~10 us of Python a call would be a third of a layer's GEMV time): x [1, K] and each
        y [1, N] made once, packs made now."""
        calls = []
        for group in weight_groups:
            x, segments = torch.randn(1, group[0].shape[1]), []
            for w in group:
                y, packed = torch.empty(1, w.shape[0]), _PACKS.get(w)
                held.extend((y, packed))
                segments += [pack_address(packed), 0, y.data_ptr(), w.shape[0], w.shape[0]]
            held.append(x)
            calls.append((x.data_ptr(), x.shape[1], segments))

        def call():
            for _ in range(GEMM_PASSES):
                for x, k, segments in calls:
                    extension.linear(x, 1, k, k, segments)
        call.held = held
        return call

    counts = [target.num_layers / GEMM_PASSES, head.numel() / head_slice.numel() / GEMM_PASSES]
    return counts, [gemvs(groups), gemvs([[head_slice]])]


def gemm_rate(repeats: int) -> float:
    """FLOP/s of the in-cache GEMM alone (bench_train.py's compute floor)."""
    flops, calls = gemm_calls()
    return flops / min(interleaved_medians(calls, repeats, torch.device("cpu")))


def step_bytes(target, packed: bool = False) -> int:
    """Bytes of weights one decode step reads: every parameter once (a tied embedding is the
    lm_head's matrix), except an untied embedding table, of which it reads one row. ``packed``:
    a matrix the cpu GEMM streams from its pack counts the pack's bytes (bf16, 4- or 8-bit packs
    hold the same values in fewer bytes), else the parameter's own."""
    from eagle_kernels.ops.decoder import _PACKS

    seen, total = set(), 0
    embedding = target.model.embed_tokens.weight
    tied = target.lm_head.weight.data_ptr() == embedding.data_ptr()
    for parameter in target.parameters():
        if parameter.data_ptr() in seen or (parameter is embedding and not tied):
            continue
        seen.add(parameter.data_ptr())
        stored = _PACKS.get(parameter) if packed and parameter.dim() == 2 else parameter
        total += stored.numel() * stored.element_size()
    return total


def linear_weights(module: torch.nn.Module) -> int:
    """Weights of ``module``'s linear layers (an lm_head included): a token through them costs
    2 FLOPs each."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


def token_flops(target, context: int) -> float:
    """FLOPs of one token: 2 per weight of every linear layer (lm_head included) plus
    attention's 4 * context * heads * head_dim per layer."""
    config = target.config
    linear = linear_weights(target)
    attention = 4 * context * config.num_attention_heads * head_dim_of(config) * \
        config.num_hidden_layers
    return 2 * linear + attention


def random_tree(nodes: int, generator: torch.Generator):
    """An EAGLE-like tree (parent among the last few nodes) and its packed mask / depths."""
    parents = torch.full((1, nodes), -1, dtype=torch.int32)
    for i in range(1, nodes):
        parents[0, i] = int(torch.randint(max(0, i - 3), i, (1,), generator=generator))
    depth, mask, _ = ops.build_tree(parents)
    return depth, mask


def verify_call(target, nodes: int, context: int, generator):
    """The target over a random ``nodes``-node tree after ``context`` tokens, with logits."""
    cache = target.allocate_cache(1, context + nodes)
    cache.lens.fill_(context)
    depth, mask = random_tree(nodes, generator)
    tokens = torch.randint(0, target.vocab_size, (1, nodes), generator=generator)
    positions = context + depth.to(torch.int64)

    def run():
        hidden, _ = target(tokens, positions, cache, mask)
        return target.logits(hidden)

    return run


def ar_step_call(target, context: int):
    """One engine autoregressive step: target over one token, logits, greedy choice."""
    cache = target.allocate_cache(1, context + 1)
    cache.lens.fill_(context)
    token = torch.zeros(1, 1, dtype=torch.int64)
    position = torch.full((1, 1), context, dtype=torch.int64)
    ones = torch.ones(1, 1, 1, dtype=torch.int32)

    def run():
        hidden, _ = target(token, position, cache, ones)
        return ops.greedy_accept_chain(token, target.logits(hidden[:, :1]))

    return run


class InARow:
    """``call`` run back to back, untimed for SETTLE_SECONDS (at least once), then
    STEPS_IN_A_ROW times, as one call of a timing round; the mean seconds of those
    STEPS_IN_A_ROW go to ``seconds``, one per call: the first is interleaved_times' warm-up
    call, left out of the median (one per round)."""

    def __init__(self, call):
        self.call, self.seconds = call, []

    def __call__(self):
        settle_steps(self.call, SETTLE_SECONDS)
        start = time.perf_counter()
        for _ in range(STEPS_IN_A_ROW):
            self.call()
        self.seconds.append((time.perf_counter() - start) / STEPS_IN_A_ROW)

    def median(self) -> float:
        return statistics.median(self.seconds[1:] or self.seconds)


def cache_bytes(target, context: int) -> int:
    """Bytes of K and V a decode step's attention reads after ``context`` tokens."""
    config = target.config
    kv_width = config.num_key_value_heads * head_dim_of(config)
    return context * config.num_hidden_layers * 2 * kv_width * target.dtype.itemsize


def timed_together(target, head, args) -> dict:
    """Median seconds of every measurement, all taken in the same interleaved rounds: this VM's
    speed drifts 20-40 % within minutes, and a ratio between two things timed minutes apart
    (the AR step against a floor, a cycle against the AR step) would measure the drift."""
    draw = torch.Generator().manual_seed(0)
    stream_bytes, streams = bandwidth_calls(args.bandwidth_mb)
    step_megabytes = -(-(step_bytes(target, packed=True)
                         + cache_bytes(target, args.context)) >> 20)  # rounded up
    step_stream_bytes, step_streams = bandwidth_calls(step_megabytes)
    down = target.model.layers[0].mlp.down_proj.weight  # SmolLM2-135M's is [576 x 1536]
    gemm_flops, gemms = gemm_calls(down if tuple(down.shape) == (576, 1536) else None)
    one_row_counts, one_row = one_row_calls(target)
    # weights_unchanged: the engine runs its loop in one such block (weights stamped once).
    with torch.inference_mode(), no_value_checks(), ops.weights_unchanged():
        groups = {"streams": streams, "step_streams": [InARow(c) for c in step_streams],
                  "gemms": gemms, "one_row": one_row,
                  # the first calls after the streams and GEMMs ran ~3-5 % slow even after 3
                  # warm-up steps (before the settling by time): the long contexts take that
                  # place, the AR step follows verify (the ratios to it are then not flattered)
                  "long": [InARow(ar_step_call(target, context))
                           for context in args.long_contexts],
                  "verify": [InARow(verify_call(target, nodes, args.context, draw))
                             for nodes in args.nodes],
                  "ar": [InARow(ar_step_call(target, args.context))],
                  "cycles": [call for tree in args.trees
                             for call in cycle_calls(target, head, tree, args.context, 1)]}
        seconds = iter(interleaved_medians([call for calls in groups.values() for call in calls],
                                           args.repeats, target.device))
        timed = {name: [next(seconds) for _ in calls] for name, calls in groups.items()}
    for name in ("ar", "long", "verify", "step_streams"):  # in a row, after the settling
        timed[name] = [call.median() for call in groups[name]]
    timed["dram_bandwidth"] = stream_bytes / min(timed["streams"])
    timed["step_sized_bandwidth"] = step_stream_bytes / min(timed["step_streams"])
    timed["bandwidth"] = max(timed["dram_bandwidth"], timed["step_sized_bandwidth"])
    timed["gemm_rate"] = gemm_flops / min(timed["gemms"])
    timed["in_cache_gemv"] = (sum(c * t for c, t in zip(one_row_counts, timed["one_row"]))
                              if one_row_counts else None)
    return timed


def measure(generator, args) -> tuple[list[dict], dict]:
    target, head = generator.engine.target, generator.engine.head
    timed = timed_together(target, head, args)
    bandwidth, rate, ar = timed["bandwidth"], timed["gemm_rate"], timed["ar"][0]
    # The kernels stream the packs (the target's layers in 4 bits): the floor counts those bytes;
    # the fp32 floor (every weight in fp32, what the step read before narrow packs) is kept beside,
    # at DRAM's bandwidth (538 MB is twice what the largest cache measured here holds).
    weight_bytes, fp32_bytes = step_bytes(target, packed=True), step_bytes(target)
    kv_bytes = cache_bytes(target, args.context)
    memory_floor = (weight_bytes + kv_bytes) / bandwidth
    flops = token_flops(target, args.context)

    def floor_of(nodes: int, context: int) -> float:
        """max(memory, compute) seconds of ``nodes`` tokens after ``context``."""
        memory = (weight_bytes + cache_bytes(target, context + nodes - 1)) / bandwidth
        return max(memory, nodes * token_flops(target, context) / rate)

    floor = floor_of(1, args.context)
    rows = [{"what": "ar_step", "nodes": 1, "context": args.context, "ms": ar * 1e3,
             "floor_ms": floor * 1e3, "x_floor": ar / floor, "x_ar_step": 1.0}]
    for context, seconds in zip(args.long_contexts, timed["long"]):
        floor = floor_of(1, context)
        rows.append({"what": "ar_step_long", "nodes": 1, "context": context, "ms": seconds * 1e3,
                     "floor_ms": floor * 1e3, "x_floor": seconds / floor,
                     "x_ar_step": seconds / ar})
    for nodes, seconds in zip(args.nodes, timed["verify"]):
        floor = floor_of(nodes, args.context)
        rows.append({"what": "verify", "nodes": nodes, "ms": seconds * 1e3,
                     "floor_ms": floor * 1e3, "x_floor": seconds / floor,
                     "x_ar_step": seconds / ar})
    for index, tree in enumerate(args.trees):
        draft, verify = timed["cycles"][2 * index:2 * index + 2]
        per_step = draft / (tree.expansion_steps + 1)  # the root's children, then each step
        rows.append({"what": "draft", "tree": f"{tree.top_k}/{tree.depth}/{tree.total_tokens}",
                     "nodes": tree.total_tokens, "ms": draft * 1e3, "step_ms": per_step * 1e3,
                     "x_ar_step": per_step / ar, "verify_ms": verify * 1e3,
                     "cycle_x_ar_step": (draft + verify) / ar})
    columns = ("what", "tree", "nodes", "context", "ms", "floor_ms", "x_floor", "x_ar_step",
               "step_ms", "verify_ms", "cycle_x_ar_step")
    rows = [{key: (round(row[key], 4) if isinstance(row.get(key), float) else row.get(key, ""))
             for key in columns} for row in rows]
    gemv = timed["in_cache_gemv"]
    floors = {"read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
              "dram_bandwidth_gb_s": round(timed["dram_bandwidth"] / 1e9, 2),
              "step_sized_bandwidth_gb_s": round(timed["step_sized_bandwidth"] / 1e9, 2),
              "gemm_gflop_s": round(rate / 1e9, 1), "weight_bytes": weight_bytes,
              "kv_bytes": kv_bytes, "memory_floor_ms": round(memory_floor * 1e3, 3),
              "compute_floor_ms": round(flops / rate * 1e3, 3), "fp32_weight_bytes": fp32_bytes,
              "fp32_memory_floor_ms": round((fp32_bytes + kv_bytes) / timed["dram_bandwidth"]
                                            * 1e3, 3),
              # our own GEMVs over in-cache weights: how far the step is from our kernels'
              # compute speed (not a floor: a slower GEMV would raise it)
              "in_cache_gemv_ms": round(gemv * 1e3, 3) if gemv else None,
              "ar_x_in_cache_gemv": round(ar / gemv, 3) if gemv else None,
              "token_gflop": round(flops / 1e9, 4), "context": args.context,
              "threads": torch.get_num_threads(), "cpu_isa": _cpu_isa(),
              "activations": ops.cpu_activations(),
              "timing": f"medians of {args.repeats} interleaved rounds; AR steps and verify "
                        f"passes: {STEPS_IN_A_ROW} in a row per round, after the same call "
                        f"ran untimed for {SETTLE_SECONDS} s"}
    return rows, floors


def _cpu_isa() -> str:
    status = ops.available_backends()["cpu"]
    return status.reason if status.available else f"cpu backend missing: {status.reason}"


def print_report(rows: list[dict], floors: dict) -> None:
    print(f"read bandwidth {floors['read_bandwidth_gb_s']} GB/s (DRAM "
          f"{floors['dram_bandwidth_gb_s']}, a buffer of the step's bytes re-read "
          f"{floors['step_sized_bandwidth_gb_s']}), in-cache GEMM "
          f"{floors['gemm_gflop_s']} GFLOP/s, weights + KV read per step "
          f"{(floors['weight_bytes'] + floors['kv_bytes']) / 1e6:.0f} MB -> memory floor "
          f"{floors['memory_floor_ms']} ms, compute floor {floors['compute_floor_ms']} ms "
          f"(fp32 weights {floors['fp32_weight_bytes'] / 1e6:.0f} MB -> "
          f"{floors['fp32_memory_floor_ms']} ms; {floors['cpu_isa']}"
          f"; {floors['activations']} activations)"
          + (f"; our one-row GEMVs over in-cache weights {floors['in_cache_gemv_ms']} ms a step "
             f"-> AR step {floors['ar_x_in_cache_gemv']} x that" if floors["in_cache_gemv_ms"]
             else ""))
    for row in rows:
        if row["what"] == "draft":
            print(f"draft {row['tree']:>9}: {row['ms']:8.2f} ms ({row['step_ms']:.2f} ms/step = "
                  f"{row['x_ar_step']:.2f} x AR step); cycle {row['cycle_x_ar_step']:.2f} x AR")
        else:
            at = f" context {row['context']}" if row["what"] == "ar_step_long" else ""
            print(f"{row['what']:>12} N={row['nodes']:>3}{at}: {row['ms']:8.2f} ms = "
                  f"{row['x_floor']:.2f} x floor ({row['floor_ms']:.1f} ms), "
                  f"{row['x_ar_step']:.2f} x AR step")


def plot(rows: list[dict], floors: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    verify = [r for r in rows if r["what"] == "verify"]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    nodes = [r["nodes"] for r in verify]
    axes.plot(nodes, [r["ms"] for r in verify], marker="o", label="verify (target + logits)")
    axes.plot(nodes, [r["floor_ms"] for r in verify], linestyle="--",
              label="max(memory floor (weights + KV), compute floor)")
    ar = next(r["ms"] for r in rows if r["what"] == "ar_step")
    axes.axhline(ar, color="gray", linestyle=":", label=f"AR step {ar:.1f} ms")
    axes.set_xlabel("tree nodes N")
    axes.set_ylabel("ms")
    axes.set_title(f"verify(N) on {environment()['device']}: "
                   f"{floors['read_bandwidth_gb_s']} GB/s, {floors['gemm_gflop_s']} GFLOP/s")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/local")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--prompts", type=int, default=10, help="e2e prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--no-e2e", action="store_true", help="floors, verify and draft only")
    parser.add_argument("--no-hf", action="store_true", help="e2e without transformers")
    parser.add_argument("--smoke", action="store_true", help="tiny: proves the script runs")
    parser.add_argument("--activations", choices=["fp32", "int16", "int8"], default="fp32",
                        help="how our GEMMs over Q4 / Q8 packs take x (ops.set_cpu_activations), "
                             "for every measurement of ours")
    args = parser.parse_args(argv)
    args.nodes, args.trees, args.bandwidth_mb = VERIFY_NODES, CANDIDATE_TREES, 1024
    args.long_contexts = LONG_CONTEXTS
    if args.smoke:
        args.nodes, args.trees, args.bandwidth_mb = (1, 4), CANDIDATE_TREES[:2], 64
        args.long_contexts = (32,)
        args.repeats, args.prompts, args.max_new_tokens, args.context = 1, 1, 4, 16
    from eagle_kernels.runtime.api import from_pretrained

    ops.set_cpu_activations(args.activations)  # before the tree budget times the cycle
    generator = from_pretrained(tree="auto")
    print(generator.budget.report())
    rows, floors = measure(generator, args)
    print_report(rows, floors)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    append_rows(out / "cpu.csv", rows)
    command = "python bench/e2e/bench_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "cpu.json").write_text(json.dumps({"environment": environment(), "floors": floors,
                                              "rows": rows, "command": command}, indent=2))
    plot(rows, floors, out / "cpu.png")
    if not args.no_e2e:
        import bench_e2e

        e2e_args = ["--prompts", str(args.prompts), "--max-new-tokens",
                    str(args.max_new_tokens), "--out", str(out)]
        bench_e2e.main(e2e_args + (["--no-hf"] if args.no_hf else []), generator=generator)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
