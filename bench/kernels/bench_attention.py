"""tree_attention: Triton / CUDA kernels vs SDPA with a dense mask and vs causal attention.

    python bench/kernels/bench_attention.py [--out DIR] [--smoke]

Shapes: Llama-3.1-8B (32 q / 8 KV heads, d 128) and SmolLM2 (9 / 3, d 64), bf16, a random
N = 60 node tree over contexts of 512 .. 16k committed keys, batch 1 / 8 / 32 (every sequence
at the same length so one batched SDPA call is a fair baseline). Per shape, one row per method:

* ``triton`` / ``cuda``: ``ops.tree_attention`` (CUDA-graph replays);
* ``sdpa_dense``: the torch path, SDPA over the cache slice with the dense [N, L + N] bool mask
  (the mask is built once outside the timing, so this baseline is if anything flattered);
* ``causal_sdpa``: SDPA causal attention of the same N queries over the same keys (lower-right
  aligned), the floor the issue compares to (bar: tree <= 1.10 x this at N = 60);
* ``decode_sdpa``: SDPA of one query per sequence over the cache (plain decode attention);
* ``triton_m32`` / ``triton_m64`` / ``triton_unordered`` (Llama shape, batch 1 and 8, a few
  contexts): the Triton kernel with its row-invariant tiles (TRITON_BLOCK_M, both passes) set
  to 32 / 64 rows,
  ``triton_pm32`` / ``triton_pm64`` its first pass's alone (``prefix_block_m``; still
  row-invariant: one tile shape per pass for every call), or with the tree keys walked in slot
  order by FA2-like tiles (not row-invariant): what the invariance costs, and which fixed tile
  to take, measured in one run; ``triton_p1`` / ``triton_p16``: its first pass aiming at 1 / 16
  programs per SM instead of PREFIX_PROGRAMS_PER_SM (how many splits a program runs: no
  arithmetic changes); ``triton_cap4x``: the same call over caches of 4x the capacity (the
  runtime sizes its cache for prompt, budget and room: the splits past the keys are empty);
  ``triton_s1`` / ``triton_s4``: the ordered kernel with 1 / 4 key
  splits instead of its capacity's (17 at 4k: whether the split count is what costs);
  ``triton_decode``: its call for one query (a decode step's attention, against decode_sdpa),
  ``triton_decode_pm64`` the same with a 64-row first-pass tile (what it costs a decode step).

Columns: median time, ``speedup_vs_torch`` (sdpa_dense / method), ``ratio_to_causal``,
``ratio_to_decode``, ``max_err_vs_dense`` (kernels only: a wrong kernel cannot post a time
unseen), and ``bw_fraction`` = floor / time: K and V bytes read (+ q, out and the packed tree
mask; a decode row: one query over the prefix and one key) per second over the fastest
bandwidth measured in the run (``floor_gbps``, common.floor_us; bar: >= 0.85 at contexts
>= 4k). SDPA runs with ``enable_gqa`` (no KV expansion); where this torch lacks it the KV heads
are expanded outside the timing and the row says so. ``--smoke``: a tiny shape on CPU (torch +
the Triton interpreter) in seconds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("EAGLE_KERNELS_CHECK_VALUES", "0")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (append_rows, bench_arguments, floor_us, graphed,  # noqa: E402
                    memory_bandwidth, plot_rows, time_fn, timing_columns, with_constants)
from op_bytes import attention_bytes  # noqa: E402

from eagle_kernels import ops  # noqa: E402
from eagle_kernels.ops import attention_triton, reference  # noqa: E402
from eagle_kernels.ops._backend import backend_status  # noqa: E402

MODELS = {"llama3-8b": (32, 8, 128), "smollm2": (9, 3, 64), "smoke": (4, 2, 16)}
NUM_NODES = 60
# Triton variants (module constants of ops.attention_triton set around the call), on these
# shapes only
TRITON_VARIANTS = {"triton_m32": {"TRITON_BLOCK_M": 32}, "triton_m64": {"TRITON_BLOCK_M": 64},
                   "triton_unordered": {"ORDERED_MAX_TREE_KEYS": 0},
                   "triton_p1": {"PREFIX_PROGRAMS_PER_SM": 1},
                   "triton_p16": {"PREFIX_PROGRAMS_PER_SM": 16}}
# The ordered kernel's first pass in tiles of these many rows (its second pass keeps its own)
PREFIX_TILE_VARIANTS = {"triton_pm32": 32, "triton_pm64": 64}
# The ordered kernel with num_splits set (its default: splits of split_keys_for(max_len) keys,
# 17 at 4k), and ``triton_decode``: its one-query call, a decode step's attention.
SPLIT_VARIANTS = (1, 4)
VARIANT_SHAPES = {("llama3-8b", b, c) for b in (1, 8) for c in (1024, 4096, 16384)} \
    | {("smoke", 1, 32)}


def make_case(model, batch, context, num_nodes, device, gen):
    """q, caches (context + nodes + slack rows), equal cache_lens, a random tree's mask."""
    q_heads, kv_heads, dim = MODELS[model]
    max_len = context + num_nodes + 16
    dtype = torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    parents = torch.full((batch, num_nodes), -1, dtype=torch.int32)
    for node in range(1, num_nodes):
        parents[:, node] = torch.randint(0, node, (batch,), generator=gen, dtype=torch.int32)
    _, mask, _ = ops.build_tree(parents.to(device))
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return (randn(batch, num_nodes, q_heads, dim), randn(batch, max_len, kv_heads, dim),
            randn(batch, max_len, kv_heads, dim), lens, mask)


def sdpa_call(q, keys, values, attn_mask=None, is_causal_lower_right=False):
    """A closure running SDPA on [B, H, S, D] views (GQA via enable_gqa when this torch has it)
    and whether the KV heads had to be expanded instead."""
    group = q.shape[1] // keys.shape[1]
    if is_causal_lower_right:
        from torch.nn.attention.bias import causal_lower_right
        attn_mask = causal_lower_right(q.shape[2], keys.shape[2])

    def run(k=keys, v=values, **extra):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **extra)

    try:
        run(enable_gqa=True)
        return (lambda: run(enable_gqa=True)), False
    except (TypeError, RuntimeError):
        k, v = (t.repeat_interleave(group, 1) for t in (keys, values))
        return (lambda: run(k, v)), True


def methods(case, context, device, variants=False):
    """name -> (callable, note) for every method of one shape (the Triton variants too)."""
    q, k, v, lens, mask = case
    num_nodes = q.shape[1]
    length = context + num_nodes
    keys, values = (t[:, :length].transpose(1, 2) for t in (k, v))  # [B, Hkv, L + N, D] views
    q_bhsd = q.transpose(1, 2)
    visible = torch.cat([torch.ones(num_nodes, context, dtype=torch.bool, device=device)
                         .expand(q.shape[0], -1, -1),
                         reference.unpack_tree_mask(mask, num_nodes)], 2).unsqueeze(1)
    found = {}
    for backend in ("triton", "cuda"):
        if backend_status(backend).available and (backend == "triton" or device.type == "cuda"):
            found[backend] = (lambda b=backend: ops.tree_attention(q, k, v, lens, mask,
                                                                   backend=b), "")
    if variants and "triton" in found:
        for name, constants in TRITON_VARIANTS.items():
            found[name] = (lambda c=constants: with_constants(attention_triton, c,
                                                             found["triton"][0]),
                           " ".join(f"{k}={v}" for k, v in constants.items()))
        for name, rows in PREFIX_TILE_VARIANTS.items():
            found[name] = (lambda r=rows: attention_triton._tree_attention_triton(
                q, k, v, lens, mask, None, num_nodes, prefix_block_m=r), f"prefix_block_m={rows}")
        for splits in SPLIT_VARIANTS:  # fewer, longer key splits than the capacity's
            found[f"triton_s{splits}"] = (
                lambda s=splits: attention_triton._tree_attention_triton(
                    q, k, v, lens, mask, None, num_nodes, num_splits=s),
                f"num_splits={splits}")
        # the runtime's caches hold the prompt, the budget and room: splits past the keys
        big_k, big_v = (torch.cat([t, torch.zeros_like(t).repeat(1, 3, 1, 1)], 1) for t in (k, v))
        found["triton_cap4x"] = (
            lambda: ops.tree_attention(q, big_k, big_v, lens, mask, backend="triton"),
            "cache capacity 4x (its splits past the keys are empty)")
        root_only = mask[:, :1, :1].contiguous()  # node 0 sees itself: a decode step's row
        found["triton_decode"] = (
            lambda: ops.tree_attention(q[:, :1].contiguous(), k, v, lens, root_only,
                                       num_tree_keys=1, backend="triton"),
            "one query over the prefix and itself (compare decode_sdpa)")
        found["triton_decode_pm64"] = (  # what a 64-row pass-1 tile costs a decode step
            lambda: attention_triton._tree_attention_triton(
                q[:, :1].contiguous(), k, v, lens, root_only, None, 1, prefix_block_m=64),
            "triton_decode with prefix_block_m=64")
    for name, call in (("sdpa_dense", sdpa_call(q_bhsd, keys, values, attn_mask=visible)),
                       ("causal_sdpa", sdpa_call(q_bhsd, keys, values,
                                                 is_causal_lower_right=True)),
                       ("decode_sdpa", sdpa_call(q_bhsd[:, :, :1], keys[:, :, :context + 1],
                                                 values[:, :, :context + 1]))):
        fn, expanded = call
        found[name] = (fn, "expanded kv" if expanded else "")
    return found


def time_method(fn, device, repeats):
    if device.type != "cuda":
        return time_fn(fn, repeats=repeats, warmup=1)
    try:
        replay = graphed(fn)
    except RuntimeError:  # an SDPA path that cannot be captured: time it eagerly
        torch.cuda.synchronize()
        replay = fn
    return time_fn(replay, repeats=repeats)


def main():
    args, device = bench_arguments(__doc__.split("\n")[0])
    gen = torch.Generator().manual_seed(0)
    if args.smoke:
        grid, num_nodes, repeats = [("smoke", 1, 32)], 5, 3
    else:
        grid = [(m, b, c) for m in ("llama3-8b", "smollm2") for b in (1, 8, 32)
                for c in (512, 1024, 2048, 4096, 8192, 16384)]
        num_nodes, repeats = NUM_NODES, 30
    bandwidth = memory_bandwidth(device, 64 if args.smoke else 1024)
    print(f"device {device}, {bandwidth}")
    rows = []
    for model, batch, context in grid:
        q_heads, kv_heads, dim = MODELS[model]
        case = make_case(model, batch, context, num_nodes, device, gen)
        # bytes a single pass must move: K and V rows of the prefix + tree, q in and out, the
        # packed mask (tree rows); causal: no mask; decode: one query over the prefix + 1 key
        tree_mask = case[4]
        moved = {"tree": attention_bytes(batch, num_nodes, context + num_nodes, q_heads, kv_heads,
                                         dim, 2, tree_mask.numel() * tree_mask.element_size()),
                 "causal": attention_bytes(batch, num_nodes, context + num_nodes, q_heads,
                                           kv_heads, dim, 2),
                 "decode": attention_bytes(batch, 1, context + 1, q_heads, kv_heads, dim, 2)}
        floors = {kind: floor_us(value, bandwidth) for kind, value in moved.items()}
        timings, notes, errors = {}, {}, {}
        found = methods(case, context, device, (model, batch, context) in VARIANT_SHAPES)
        dense = found["sdpa_dense"][0]().transpose(1, 2).float()
        decode = found["decode_sdpa"][0]().transpose(1, 2).float()
        for name, (fn, note) in found.items():
            # a wrong kernel (or variant) must not post a fast time unseen
            if name.startswith("triton") or name == "cuda":
                expected = decode if name == "triton_decode" else dense
                errors[name] = round((fn().float() - expected).abs().max().item(), 4)
            timings[name], notes[name] = time_method(fn, device, repeats), note
        base, causal = timings["sdpa_dense"], timings["causal_sdpa"]
        for name, timing in timings.items():
            kind = ("decode" if name in ("decode_sdpa", "triton_decode")
                    else "causal" if name == "causal_sdpa" else "tree")
            floor = floors[kind]
            row = dict(op="tree_attention", model=model, method=name, backend=name,
                       dtype="bfloat16", batch=batch,
                       context=context, num_nodes=num_nodes,
                       **timing_columns(timing, base, floor),
                       ratio_to_causal=round(timing.median_us / causal.median_us, 3),
                       ratio_to_decode=round(timing.median_us
                                             / timings["decode_sdpa"].median_us, 3),
                       bw_fraction=round(floor / timing.median_us, 3), bytes=moved[kind],
                       **bandwidth.columns(),
                       max_err_vs_dense=errors.get(name, ""), note=notes[name])
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()))
        # each shape's rows as they come: a run cut short by its stage's budget keeps them
        append_rows(Path(args.out) / "bench_attention.csv", rows[-len(timings):])
    out = Path(args.out)
    plot_rows([dict(r, series=f"{r['method']} {r['model']} B={r['batch']}") for r in rows
               if r["method"] in ("triton", "cuda", "causal_sdpa", "sdpa_dense")],
              "context", "median_us", "series", out / "bench_attention.png",
              f"tree_attention, N={num_nodes} (bf16)")


if __name__ == "__main__":
    main()
