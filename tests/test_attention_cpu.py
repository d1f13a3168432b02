"""tree_attention on the cpu backend (csrc/cpu/attention.h): against the reference on awkward
sizes, bit-for-bit row invariance (a tree node's output equals a decode step's at its position),
on every instruction set this processor has, and bounds whatever the lengths say.

Caches hold NaN past ``cache_lens[b] + T`` (see ``make_case``), so a kernel that reads a key it
must not see fails the comparison.

Tolerance (``assert_close_to_fp64``; the project's rule, as assert_flash_close applies it to
fp16 / bf16): the kernel takes float32 only, so its truth is the same attention computed in
float64 on the exactly upcast inputs, and its error (the max over the whole output) must be at
most twice the error of torch's fp32 attention (the reference) plus NOISE = 2e-6 of the
output's scale (16 ulps: the kernel's polynomial exp and blockwise sums reach 8 ulps where
torch's error is 1-4; assert_flash_close's noise is 1e-6 absolute + 2 ulps). Given the run's
seed the verdict is deterministic (seeded inputs; the kernel's sums run in a fixed order
whatever the thread count: see the bit-for-bit tests). Over seeds, measured on every case of
the four tests that use it (600 seeds, every ISA: 33720 comparisons): error / budget max 0.31,
log-mean -2.6, log-sd 0.44; an exponential tail fitted to the top 5% (far heavier than the
data's) puts error > budget at <= 7e-8 a comparison, <= 2e-7 per test run (3 ISAs). Power
(the binding wrapped): its softmax scale 1 + 1e-5 off fails 17 of the 19 value-checking cases
(the two that pass see one key), its output 1 + 1e-5 off all 19; the old fixed rtol=1e-4 /
atol=2e-5 against the fp32 reference passed both everywhere. An output row left holding its
neighbour's values fails every case (old and new).
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference

from conftest import random_parents
from cpu_support import each_cpu_isa, needs_cpu_backend
from cuda_support import seed_note
from test_attention_kernels import assert_flash_close, low_precision_attention, make_case

pytestmark = needs_cpu_backend

# (batch, num_queries, prefix, q_heads, kv_heads, head_dim): decode, verify trees, prefill
# chunks, GQA groups 1..4, 16 (the most heads one task holds) and 20 (one head per task),
# head_dims that are not multiples of 16 lanes, prefixes over several key blocks of 64.
GRID = [(1, 1, 0, 4, 2, 64), (3, 7, 37, 9, 3, 64), (1, 33, 511, 4, 2, 64), (3, 65, 1, 9, 3, 64),
        (2, 1, 300, 9, 3, 128), (2, 5, 17, 2, 2, 80), (1, 3, 9, 3, 1, 8), (2, 60, 256, 9, 3, 64),
        (2, 9, 130, 32, 2, 40), (1, 5, 70, 20, 1, 64)]


def cpu_attention(q, k, v, lens, mask, tree_keys=None):
    tree_keys = q.shape[1] if tree_keys is None else tree_keys
    return ops.tree_attention(q, k, v, lens, mask, num_tree_keys=tree_keys, backend="cpu")


NOISE = 2e-6  # of the output's scale (see the module note)


def assert_close_to_fp64(out, q, k, v, lens, mask, tree_keys, note):
    """fp32 ``out`` against float64 attention (the same math, test_attention_kernels'
    low_precision_attention, on the exactly upcast inputs): within 2x the error of torch's fp32
    attention (reference.tree_attention) + NOISE x max |exact| (see the module note)."""
    assert out.dtype == q.dtype == torch.float32 and out.shape == q.shape, note
    exact = low_precision_attention(q.double(), k.double(), v.double(), lens, mask, tree_keys)
    torch_fp32 = reference.tree_attention(q, k, v, lens, mask, num_tree_keys=tree_keys)
    scale = float(exact.abs().max()) if exact.numel() else 1.0
    error = float((out.double() - exact).abs().max()) if exact.numel() else 0.0
    torch_error = float((torch_fp32.double() - exact).abs().max()) if exact.numel() else 0.0
    assert error <= 2 * torch_error + NOISE * scale, \
        f"error {error:.3g} > 2 x torch fp32 {torch_error:.3g} + {NOISE} x {scale:.3g}: {note}"


@pytest.mark.parametrize("batch,num_queries,prefix,q_heads,kv_heads,head_dim", GRID,
                         ids=[f"B{c[0]}-N{c[1]}-L{c[2]}-H{c[3]}/{c[4]}-D{c[5]}" for c in GRID])
def test_cpu_matches_reference(gen, batch, num_queries, prefix, q_heads, kv_heads, head_dim):
    case = make_case(gen, batch, num_queries, prefix, q_heads, kv_heads, head_dim, torch.float32)
    for isa in each_cpu_isa():
        assert_close_to_fp64(cpu_attention(*case), *case, num_queries, f"{isa} {seed_note(gen)}")


def test_cpu_draft_frontier_over_more_tree_keys(gen):
    """Drafting: the last Nq of T tree nodes query all T tree keys (tree_offset in the head)."""
    case = make_case(gen, 2, 4, 23, 4, 2, 64, torch.float32, tree_keys=13)
    for isa in each_cpu_isa():
        assert_close_to_fp64(cpu_attention(*case, tree_keys=13), *case, 13,
                             f"{isa} {seed_note(gen)}")


def _ancestors(parents: torch.Tensor, node: int) -> list[int]:
    chain = []
    while node >= 0:
        chain.append(node)
        node = int(parents[node])
    return chain[::-1]  # root first


@pytest.mark.parametrize("num_nodes", [1, 2, 16, 64])
def test_tree_node_equals_decode_step_bit_for_bit(gen, num_nodes):
    """Row invariance: node i of a verify tree over prefix L gives exactly the output of a
    one-token decode step at position L + depth(i), whose cache holds the prefix followed by
    i's ancestors in order (different slots, different neighbours, same visible keys). The
    value sums' blocks (kernels.h kAttentionValueBlock, 64 positions) close at the same list
    positions either way: prefix 37 and deep trees cross position 64 among the tree keys,
    prefix 130 inside the tree's own part-block."""
    batch, q_heads, kv_heads, dim = 2, 9, 3, 64
    parents = random_parents(batch, num_nodes, gen, "deep")
    _, mask, _ = ops.build_tree(parents)
    lens = torch.tensor([37, 130], dtype=torch.int32)
    max_len = int(lens.max()) + num_nodes
    k = torch.randn(batch, max_len, kv_heads, dim, generator=gen)
    v = torch.randn(batch, max_len, kv_heads, dim, generator=gen)
    q = torch.randn(batch, num_nodes, q_heads, dim, generator=gen)
    one = torch.ones(1, 1, 1, dtype=torch.int32)
    for isa in each_cpu_isa():
        tree_out = cpu_attention(q, k, v, lens, mask)
        for b in range(batch):
            prefix = int(lens[b])
            for node in range(num_nodes):
                chain = _ancestors(parents[b], node)
                slots = [prefix + j for j in chain]  # where the tree pass wrote each key
                k_dec = torch.cat([k[b, :prefix], k[b, slots]]).unsqueeze(0).contiguous()
                v_dec = torch.cat([v[b, :prefix], v[b, slots]]).unsqueeze(0).contiguous()
                decode_len = torch.tensor([prefix + len(chain) - 1], dtype=torch.int32)
                decoded = cpu_attention(q[b:b + 1, node:node + 1].contiguous(), k_dec, v_dec,
                                        decode_len, one)
                assert torch.equal(decoded[0, 0], tree_out[b, node]), \
                    (isa, b, node, seed_note(gen))


def _raw_attention(q, k, v, lens, mask, tree_keys, threads):
    """The binding itself, on an explicit thread count (ops.tree_attention uses torch's)."""
    from eagle_kernels.ops._backend import cpu_extension

    out = torch.empty_like(q)
    batch, queries, q_heads, head_dim = q.shape
    cpu_extension().tree_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), lens.data_ptr(), mask.data_ptr(),
        out.data_ptr(), batch=batch, queries=queries, q_heads=q_heads, kv_heads=k.shape[2],
        head_dim=head_dim, max_len=k.shape[1], tree_keys=tree_keys, words=mask.shape[2],
        scale=head_dim**-0.5, threads=threads)
    return out


# (batch, num_queries, prefix, q_heads, kv_heads, head_dim, extra tree keys): calls of at most
# 3 nodes (kernels.h kAttentionSplitMaxQueries) on several threads take the split plan.
SPLIT_GRID = [(1, 1, 256, 9, 3, 64, 0), (3, 2, 130, 4, 2, 40, 3), (2, 3, 0, 3, 1, 33, 1),
              (1, 1, 1, 2, 2, 8, 0), (2, 2, 300, 6, 2, 128, 5), (3, 3, 65, 9, 3, 64, 2)]


@pytest.mark.parametrize("batch,num_queries,prefix,q_heads,kv_heads,head_dim,extra", SPLIT_GRID)
def test_split_plan_equals_task_plan_bit_for_bit(gen, batch, num_queries, prefix, q_heads,
                                                 kv_heads, head_dim, extra):
    """A few nodes on several threads share keys and value columns out (attention.h
    tree_attention_split); one thread runs the task plan. Per query the arithmetic is the same,
    so the outputs are the same bits, whatever the thread count (ragged prefixes, GQA groups,
    head dims that are not a multiple of the 32-column blocks, more tree keys than nodes)."""
    tree_keys = num_queries + extra
    lens = torch.randint(prefix // 2, prefix + 1, (batch,), generator=gen, dtype=torch.int32)
    max_len = prefix + tree_keys
    k = torch.randn(batch, max_len, kv_heads, head_dim, generator=gen)
    v = torch.randn(batch, max_len, kv_heads, head_dim, generator=gen)
    q = torch.randn(batch, num_queries, q_heads, head_dim, generator=gen)
    mask = ops.pack_tree_mask(torch.rand(batch, num_queries, tree_keys, generator=gen) < 0.5)
    for isa in each_cpu_isa():
        tasks = _raw_attention(q, k, v, lens, mask, tree_keys, threads=1)
        for threads in (2, 3):
            split = _raw_attention(q, k, v, lens, mask, tree_keys, threads=threads)
            assert torch.equal(split, tasks), (isa, threads, seed_note(gen))
        assert_close_to_fp64(tasks, q, k, v, lens, mask, tree_keys, f"{isa} {seed_note(gen)}")


@pytest.mark.parametrize("count", [2, 4], ids=["split-plan", "task-plan"])
def test_cpu_stays_in_bounds_whatever_the_lengths(gen, count):
    """cache_lens outside [0, max_len - T] are a caller bug (value checks off): the kernel
    clamps them, reads only the cache and writes only ``out`` (both plans)."""
    batch, max_len = 3, 12
    k = torch.randn(batch, max_len, 2, 16, generator=gen)
    v = torch.randn(batch, max_len, 2, 16, generator=gen)
    q = torch.randn(batch, count, 4, 16, generator=gen)
    _, mask, _ = ops.build_tree(random_parents(batch, count, gen))
    lens = torch.tensor([-7, 11, 2**30], dtype=torch.int32)
    clamped = lens.clamp(0, max_len - count)
    from eagle_kernels.ops._validate import no_value_checks

    with no_value_checks():
        out = cpu_attention(q, k, v, lens, mask)
    assert_close_to_fp64(out, q, k, v, clamped, mask, count, seed_note(gen))
    for threads in (1, 2):  # the task plan, and the split plan where count allows it
        assert_close_to_fp64(_raw_attention(q, k, v, lens, mask, count, threads), q, k, v,
                             clamped, mask, count, f"threads={threads} {seed_note(gen)}")


def test_auto_picks_cpu_for_float32_and_torch_otherwise(gen):
    """Which backend auto picks is discrete: its output is that backend's, bit for bit. The
    bf16 answer is then held to the flash-attention rule (assert_flash_close: within 2x the
    error of PyTorch's bf16 attention against the fp32-upcast reference, plus fp32 noise)."""
    case = make_case(gen, 1, 3, 5, 4, 2, 64, torch.float32)
    assert torch.equal(ops.tree_attention(*case), cpu_attention(*case)), seed_note(gen)
    low = [t.to(torch.bfloat16) if t.is_floating_point() else t for t in case]
    auto = ops.tree_attention(*low)
    assert torch.equal(auto, ops.tree_attention(*low, backend="torch")), seed_note(gen)
    assert_flash_close(auto, *low, 3, f"auto bf16 {seed_note(gen)}")
    with pytest.raises(ValueError, match="float32"):
        cpu_attention(*low)


def test_cpu_binding_refuses_head_counts_and_tree_keys_it_cannot_serve():
    """The raw binding (no Python checks in front) refuses kv_heads < 1, q_heads not a multiple
    of kv_heads and more tree keys than the cache holds, before touching any pointer."""
    from eagle_kernels.ops._backend import cpu_extension

    for q_heads, kv_heads, max_len, tree_keys in ((4, 0, 8, 1), (9, 2, 8, 1), (4, 2, 8, 9)):
        with pytest.raises(ValueError, match="tree_attention"):
            cpu_extension().tree_attention(0, 0, 0, 0, 0, 0, batch=1, queries=1,
                                           q_heads=q_heads, kv_heads=kv_heads, head_dim=8,
                                           max_len=max_len, tree_keys=tree_keys, words=1,
                                           scale=1.0)
