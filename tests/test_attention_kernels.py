"""tree_attention kernels: Triton (interpreter on CPU), the CUDA kernel on a GPU, the bench smoke.

Tolerance (flash-attention's rule): against the fp32 reference, a kernel's error must be at most
twice the error of the same attention computed by PyTorch in the low-precision dtype, plus the
rounding noise of fp32 around the output; fp32 inputs must match the fp32 reference closely.
Cache rows past ``cache_lens[b] + T`` hold NaN, so a kernel that reads a key it must not see
fails. CPU sizes are scaled down (the interpreter runs every program one after another); the
issue's full grid runs in the ``needs_gpu`` tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from eagle_kernels import ops
from eagle_kernels.ops import attention, attention_triton, reference

from conftest import chain_parents, random_parents
from cuda_support import (_import_extension, _missing_extension, gpu_when_present, needs_gpu,
                          seed_note)

LOW = (torch.float16, torch.bfloat16)


def make_case(gen, batch, num_queries, prefix, q_heads, kv_heads, head_dim, dtype,
              tree_keys=None, parents=None, device="cpu"):
    """Random q / caches / per-sequence lengths and a random tree's packed mask.

    Sequence 0 has ``prefix`` committed keys, the others a random length in [0, prefix]. With
    ``tree_keys`` T > Nq the queries are the last Nq nodes of a T-node tree (a draft frontier).
    Rows past L + T are NaN (plus two spare rows) so reading them poisons the output.
    """
    tree_keys = num_queries if tree_keys is None else tree_keys
    if parents is None:
        parents = random_parents(batch, tree_keys, gen, "deep" if prefix % 2 else "uniform")
    _, mask, _ = ops.build_tree(parents)
    mask = mask[:, tree_keys - num_queries:].contiguous()
    lens = torch.randint(0, prefix + 1, (batch,), generator=gen, dtype=torch.int32)
    lens[0] = prefix
    max_len = prefix + tree_keys + 2
    # draw the big tensors where they live (a CPU draw of the GPU grid's caches is slow)
    draw = gen if device == "cpu" else torch.Generator(device).manual_seed(
        int(torch.randint(2**62, (1,), generator=gen)))
    k = torch.randn(batch, max_len, kv_heads, head_dim, generator=draw, device=device)
    v = torch.randn(batch, max_len, kv_heads, head_dim, generator=draw, device=device)
    for b in range(batch):
        k[b, int(lens[b]) + tree_keys:] = float("nan")
        v[b, int(lens[b]) + tree_keys:] = float("nan")
    q = torch.randn(batch, num_queries, q_heads, head_dim, generator=draw, device=device)
    return [t.to(dtype) for t in (q, k, v)] + [lens.to(device), mask.to(device)]


def low_precision_attention(q, k, v, lens, mask, tree_keys):
    """The reference's math done by PyTorch in q's dtype (logits, softmax, weighted sum)."""
    batch, num_queries, q_heads, head_dim = q.shape
    group = q_heads // k.shape[2]
    visible = reference.unpack_tree_mask(mask, tree_keys)
    out = torch.zeros_like(q)
    for b in range(batch):
        length = int(lens[b]) + tree_keys
        keys = k[b, :length].repeat_interleave(group, 1)
        values = v[b, :length].repeat_interleave(group, 1)
        logits = torch.einsum("qhd,khd->hqk", q[b], keys) * head_dim**-0.5
        seen = torch.cat([torch.ones(num_queries, int(lens[b]), dtype=torch.bool,
                                     device=q.device), visible[b]], 1)
        probs = logits.masked_fill(~seen, float("-inf")).softmax(-1).nan_to_num(0.0)
        out[b] = torch.einsum("hqk,khd->qhd", probs, values)
    return out


def assert_flash_close(out, q, k, v, lens, mask, tree_keys, note):
    assert out.dtype == q.dtype and out.shape == q.shape, note
    want = reference.tree_attention(q.float(), k.float(), v.float(), lens, mask,
                                    num_tree_keys=tree_keys)
    if q.dtype == torch.float32:
        torch.testing.assert_close(out, want, rtol=1e-4, atol=2e-5, msg=lambda m: f"{m} {note}")
        return
    error = (out.float() - want).abs().max().item()
    pytorch_error = (low_precision_attention(q, k, v, lens, mask, tree_keys).float()
                     - want).abs().max().item()
    noise = 2 * (want + 0.3 - 0.3 - want).abs().max().item()
    assert error <= 2 * pytorch_error + noise + 1e-6, \
        f"error {error:.3g} > 2 x pytorch {q.dtype} error {pytorch_error:.3g} + {noise:.2g} {note}"


def run_triton(q, k, v, lens, mask, tree_keys=None, num_splits=None):
    tree_keys = q.shape[1] if tree_keys is None else tree_keys
    if num_splits is None:
        return ops.tree_attention(q, k, v, lens, mask, num_tree_keys=tree_keys, backend="triton")
    return attention_triton._tree_attention_triton(q, k, v, lens, mask, None, tree_keys,
                                                  num_splits)


# --------------------------------------------------------------------------------------------
# CPU: the Triton kernel in the interpreter
# --------------------------------------------------------------------------------------------

# (batch, num_queries, prefix, q_heads, kv_heads): the awkward sizes, scaled down
CPU_GRID = [(1, 1, 0, 4, 2), (3, 7, 37, 9, 3), (1, 33, 511, 4, 2), (3, 65, 1, 9, 3),
            (3, 1, 511, 9, 3), (1, 7, 1, 4, 2), (3, 33, 0, 4, 2)]


@pytest.mark.parametrize("batch,num_queries,prefix,q_heads,kv_heads", CPU_GRID,
                         ids=[f"B{c[0]}-N{c[1]}-L{c[2]}-H{c[3]}/{c[4]}" for c in CPU_GRID])
def test_triton_matches_reference_fp32(gen, batch, num_queries, prefix, q_heads, kv_heads):
    case = make_case(gen, batch, num_queries, prefix, q_heads, kv_heads, 64, torch.float32)
    assert_flash_close(run_triton(*case), *case, num_queries, seed_note(gen))


@pytest.mark.parametrize("dtype", LOW, ids=["fp16", "bf16"])
@pytest.mark.parametrize("batch,num_queries,prefix,q_heads,kv_heads",
                         [(3, 7, 37, 9, 3), (1, 65, 1, 4, 2), (3, 1, 511, 4, 2)])
def test_triton_low_precision(gen, dtype, batch, num_queries, prefix, q_heads, kv_heads):
    case = make_case(gen, batch, num_queries, prefix, q_heads, kv_heads, 64, dtype)
    assert_flash_close(run_triton(*case), *case, num_queries, f"{dtype} {seed_note(gen)}")


@pytest.mark.parametrize("head_dim", [16, 128, 80])
def test_triton_other_head_dims(gen, head_dim):
    case = make_case(gen, 2, 5, 40, 4, 1, head_dim, torch.float16)
    assert_flash_close(run_triton(*case), *case, 5, f"D={head_dim} {seed_note(gen)}")


@pytest.mark.parametrize("num_splits", [1, 2, 5, 16])
def test_triton_split_kv_merge(gen, num_splits):
    """Forced split counts (16: most splits of the short sequences are empty)."""
    case = make_case(gen, 3, 7, 300, 4, 2, 64, torch.float32)
    assert_flash_close(run_triton(*case, num_splits=num_splits), *case, 7,
                       f"splits={num_splits} {seed_note(gen)}")


def test_triton_chain_equals_causal_sdpa(gen):
    """A chain-shaped tree is causal attention: prefill (prefix 0) and verify after a prefix."""
    for prefix, num_nodes in ((0, 130), (45, 20)):
        q, k, v, lens, mask = make_case(gen, 1, num_nodes, prefix, 4, 2, 64, torch.float32,
                                        parents=chain_parents(1, num_nodes))
        out = run_triton(q, k, v, lens, mask)
        length = prefix + num_nodes
        keys = k[0, :length].repeat_interleave(2, 1).transpose(0, 1)
        values = v[0, :length].repeat_interleave(2, 1).transpose(0, 1)
        causal = torch.ones(num_nodes, length, dtype=torch.bool).tril(prefix)
        want = F.scaled_dot_product_attention(q[0].transpose(0, 1), keys, values,
                                              attn_mask=causal).transpose(0, 1)
        torch.testing.assert_close(out[0], want, rtol=1e-4, atol=2e-5)


def test_triton_single_query_equals_decode(gen):
    q, k, v, lens, mask = make_case(gen, 3, 1, 100, 9, 3, 64, torch.float32)
    out = run_triton(q, k, v, lens, mask, num_splits=3)
    for b in range(3):
        length = int(lens[b]) + 1
        keys = k[b, :length].repeat_interleave(3, 1).transpose(0, 1)
        values = v[b, :length].repeat_interleave(3, 1).transpose(0, 1)
        want = F.scaled_dot_product_attention(q[b].transpose(0, 1), keys, values)
        torch.testing.assert_close(out[b], want.transpose(0, 1), rtol=1e-4, atol=2e-5)


def test_triton_draft_frontier_over_more_tree_keys(gen):
    """Drafting: Nq = 4 frontier queries over T = 37 drafted keys (two mask words)."""
    case = make_case(gen, 3, 4, 20, 9, 3, 64, torch.float32, tree_keys=37)
    assert_flash_close(run_triton(*case, tree_keys=37), *case, 37, seed_note(gen))


def test_triton_query_seeing_nothing_gets_zeros(gen):
    q, k, v, lens, mask = make_case(gen, 2, 3, 0, 2, 1, 16, torch.float32)
    mask[:, 1] = 0  # query 1 sees no key at all (prefix 0)
    for splits in (1, 2):
        out = run_triton(q, k, v, lens, mask, num_splits=splits)
        assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1]))
        assert_flash_close(out, q, k, v, lens, mask, 3, seed_note(gen))


TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # else the interpreter


def decode_steps(q, k, v, lens, parents, b):
    """Node i of sequence b as a decode step: one query over a cache holding the prefix and
    then the node's path (root .. i) at positions L .. L + depth, NaN past it; batch = nodes."""
    num_nodes, prefix = q.shape[1], int(lens[b])
    k_dec = torch.full((num_nodes,) + tuple(k.shape[1:]), float("nan"), dtype=k.dtype,
                       device=k.device)
    v_dec = torch.full_like(k_dec, float("nan"))
    lens_dec = torch.empty(num_nodes, dtype=torch.int32)
    for node in range(num_nodes):
        path = [node]
        while int(parents[b, path[-1]]) >= 0:
            path.append(int(parents[b, path[-1]]))
        rows = torch.tensor(list(range(prefix)) + [prefix + j for j in reversed(path)],
                            device=k.device)
        k_dec[node, :len(rows)] = k[b, rows]
        v_dec[node, :len(rows)] = v[b, rows]
        lens_dec[node] = len(rows) - 1
    mask = torch.ones(num_nodes, 1, 1, dtype=torch.int32, device=q.device)
    return q[b].unsqueeze(1).contiguous(), k_dec, v_dec, lens_dec.to(q.device), mask


# (dtype, tree shape, nodes, prefix, q heads, kv heads): 517 = three 256-key splits; 60 and 250
# put a chain's keys across 64-key blocks (a decode step folds them in its shared-prefix loop, a
# tree node in its per-node loop), 250 across the split at 256 too; GQA groups 3, 4 and 32
ORDERED_CASES = [(torch.float32, "deep", 24, 517, 9, 3), (torch.bfloat16, "uniform", 24, 517, 9, 3),
                 (torch.float32, "chain", 20, 60, 16, 4), (torch.bfloat16, "chain", 12, 250, 9, 3),
                 (torch.float16, "chain", 12, 250, 32, 1)]


@gpu_when_present
@pytest.mark.parametrize("dtype, shape, nodes, prefix, q_heads, kv_heads", ORDERED_CASES,
                         ids=[f"{str(c[0])[6:]}-{c[1]}{c[2]}-L{c[3]}-H{c[4]}/{c[5]}"
                              for c in ORDERED_CASES])
@pytest.mark.parametrize("backend", ["triton"])  # the verdict credits the backend a GPU case names
def test_triton_tree_node_equals_its_decode_step_bit_for_bit(gen, dtype, shape, nodes, prefix,
                                                              q_heads, kv_heads, backend):
    """Row invariance: every node of a verify pass (sequence 0 over the stated prefix, sequence
    1 over a random shorter one) gives exactly what a decode step at its position gives over a
    cache holding its ancestors in position order. Exact for every input by construction, so
    no false failures; power: the next test. On CUDA tensors in the GPU run."""
    parents = random_parents(2, nodes, gen, shape)
    q, k, v, lens, mask = make_case(gen, 2, nodes, prefix, q_heads, kv_heads, 64, dtype,
                                    parents=parents, device=TRITON_DEVICE)
    out = run_triton(q, k, v, lens, mask)
    for b in range(2):
        want = run_triton(*decode_steps(q, k, v, lens, parents, b)).squeeze(1)
        same = [torch.equal(out[b, i], want[i]) for i in range(nodes)]
        assert all(same), (b, same.index(False), seed_note(gen))


@gpu_when_present
@pytest.mark.parametrize("backend", ["triton"])  # the verdict credits the backend a GPU case names
def test_row_invariance_check_catches_slot_ordered_tree_keys(gen, monkeypatch, backend):
    """Power of the test above: the unordered walk (tree keys in blocks of their own after the
    prefix, as prefill chains run) gives a node other bits than its decode step. Measured over
    seeds 0-11: all 24 nodes (all 216 query rows) differed every time; one is enough to fail,
    so one is what this asserts (a false failure needs every node's bits to survive the
    reordered sums)."""
    parents = random_parents(1, 24, gen, "deep")
    q, k, v, lens, mask = make_case(gen, 1, 24, 517, 9, 3, 64, torch.float32, parents=parents,
                                    device=TRITON_DEVICE)
    want = run_triton(*decode_steps(q, k, v, lens, parents, 0)).squeeze(1)
    monkeypatch.setattr(attention_triton, "ORDERED_MAX_TREE_KEYS", 0)
    out = run_triton(q, k, v, lens, mask)
    differ = sum(not torch.equal(out[0, i], want[i]) for i in range(24))
    assert differ >= 1, (differ, seed_note(gen))


@gpu_when_present
@pytest.mark.parametrize("prefix_rows", [32, 64])
@pytest.mark.parametrize("backend", ["triton"])  # the verdict credits the backend a GPU case names
def test_a_taller_first_pass_tile_keeps_nodes_exact_and_close(gen, prefix_rows, backend):
    """The ordered first pass may take taller tiles than the second (``prefix_block_m``, the
    benchmarks' triton_pm32 / pm64): the fp32 state crosses between the passes row by row, so
    every node still equals its decode step (at the same first-pass tile) bit for bit, and the
    output the reference's within flash tolerance. Exact (and the tolerance that of every
    Triton case), so no false failures; power: a first-pass grid counted in tiles of another
    height leaves rows without a prefix state, which fails the closeness check (checked with
    that mutation)."""
    def run(q, k, v, lens, mask):
        return attention_triton._tree_attention_triton(q, k, v, lens, mask, None, q.shape[1],
                                                       prefix_block_m=prefix_rows)
    parents = random_parents(2, 24, gen, "deep")
    q, k, v, lens, mask = make_case(gen, 2, 24, 517, 9, 3, 64, torch.bfloat16, parents=parents,
                                    device=TRITON_DEVICE)
    out = run(q, k, v, lens, mask)
    assert_flash_close(out, q, k, v, lens, mask, 24, seed_note(gen))
    with pytest.raises(ValueError, match="prefix_block_m: expected a power of two >= 16"):
        attention_triton._tree_attention_triton(q, k, v, lens, mask, None, 24,
                                                prefix_block_m=prefix_rows + 8)
    for b in range(2):
        want = run(*decode_steps(q, k, v, lens, parents, b)).squeeze(1)
        same = [torch.equal(out[b, i], want[i]) for i in range(24)]
        assert all(same), (b, same.index(False), seed_note(gen))


@gpu_when_present
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("run", [2, 3])
def test_splits_per_program_change_no_bit(gen, monkeypatch, dtype, run):
    """The ordered first pass may run several splits per program (few programs per SM: every
    P-th split): each still starts from a fresh state and is stored alone, so the output is bit
    for bit the one-split-per-program output, in a cache of eight 256-key splits of which
    sequence 0's prefix fills five (program 0 then runs splits 0 and 4 or 0 and 3; the last
    splits are empty: skipped by the merge). Exact, so no false failures; power: a state carried
    from one split into the next (the bug this guards) fails both dtypes and runs (checked with
    that mutation)."""
    q, k, v, lens, mask = make_case(gen, 2, 9, 1100, 8, 2, 32, dtype, device=TRITON_DEVICE)
    pad = torch.full((2, 2048 - k.shape[1]) + tuple(k.shape[2:]), float("nan"), dtype=dtype,
                     device=k.device)
    k, v = torch.cat([k, pad], 1), torch.cat([v, pad], 1)
    units, splits = 2 * 2 * 3, 8  # sequences x KV heads x row tiles (9 x 4 rows in tiles of 16)
    monkeypatch.setattr(attention_triton, "PREFIX_PROGRAMS_PER_SM", 1e9)
    assert attention_triton.splits_per_program(units, splits, q.device) == 1
    want = run_triton(q, k, v, lens, mask)
    sms = attention_triton._sm_count(q.device)
    monkeypatch.setattr(attention_triton, "PREFIX_PROGRAMS_PER_SM",
                        units * splits / (run + 0.5) / sms)
    assert attention_triton.splits_per_program(units, splits, q.device) == run
    assert torch.equal(run_triton(q, k, v, lens, mask), want), seed_note(gen)


def test_split_count_heuristic():
    cpu = torch.device("cpu")  # the interpreter pretends to be an H100: 132 SMs
    assert attention.choose_num_splits(8, 16384, cpu) == 32  # batch 1 decode: fill the GPU
    assert attention.choose_num_splits(32, 4096, cpu) == 9
    assert attention.choose_num_splits(32, 600, cpu) == 2  # >= 256 keys per split
    assert attention.choose_num_splits(1024, 16384, cpu) == 1  # prefill / big batch: one pass
    assert attention.choose_num_splits(8, 100, cpu) == 1


def test_ordered_split_positions_follow_the_capacity_bucket_only():
    """Triton ordered calls: 256-key splits for every cache of up to 8192 keys, then the
    capacity's power of two / 32 (a 32-wide key block for 256-wide heads divides them too)."""
    for max_len in (1, 300, 8192):
        assert attention_triton.split_keys_for(max_len, 64) == 256
    split_keys_for = attention_triton.split_keys_for
    assert split_keys_for(8193, 64) == split_keys_for(16384, 64) == 512
    assert attention_triton.split_keys_for(100_000, 32) == 4096


def test_triton_backend_rejects_huge_heads(gen):
    q, k, v, lens, mask = make_case(gen, 1, 2, 3, 2, 1, 264, torch.float32)
    with pytest.raises(ValueError, match="head_dim <= 256"):
        ops.tree_attention(q, k, v, lens, mask, backend="triton")


def test_cuda_backend_rejects_what_it_does_not_cover(gen):
    q, k, v, lens, mask = make_case(gen, 1, 2, 3, 2, 1, 16, torch.float32)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        attention._tree_attention_cuda(q, k, v, lens, mask, None, 2)
    with pytest.raises(ValueError, match="head_dim"):
        attention._tree_attention_cuda(q.half(), k.half(), v.half(), lens, mask, None, 2)


def test_cuda_extension_exposes_tree_attention():
    module, error = _import_extension()
    if module is None:
        _missing_extension(error)
    assert callable(module.tree_attention)
    assert callable(module.tree_attention_host)


def host_twin(ext, q, k, v, lens, mask, tree_keys, num_splits):
    batch, num_queries, q_heads, head_dim = q.shape
    out = torch.empty_like(q)
    part_o, part_lse = attention._workspace(q, num_splits)
    ext.tree_attention_host(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), lens.data_ptr(), mask.data_ptr(),
        out.data_ptr(), part_o.data_ptr(), part_lse.data_ptr(), batch, num_queries, q_heads,
        k.shape[2], head_dim, tree_keys, mask.shape[2], q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), num_splits, head_dim**-0.5,
        attention.CUDA_DTYPE_CODES[q.dtype])
    return out


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", LOW, ids=["fp16", "bf16"])
def test_cuda_host_twin_matches_reference(ext, gen, num_splits, dtype):
    """The CUDA kernel's tiling and per-row code (csrc/attention.cuh) run on the host."""
    for shape in ((3, 7, 70, 9, 3, 64, 7), (2, 3, 150, 4, 1, 128, 40), (1, 65, 0, 4, 2, 64, 65)):
        q, k, v, lens, mask = make_case(gen, *shape[:5], shape[5], dtype, tree_keys=shape[6])
        if shape[2] == 0:
            mask[:, 1] = 0  # a query that sees nothing: zeros
        out = host_twin(ext, q, k, v, lens, mask, shape[6], num_splits)
        assert_flash_close(out, q, k, v, lens, mask, shape[6], f"host {shape} {seed_note(gen)}")


def test_cuda_host_twin_rejects_bad_sizes(ext):
    args = [0] * 8 + [1, 1, 4, 2, 64, 1, 1] + [0] * 6 + [1, 0.1]
    with pytest.raises(ValueError, match="dtype_code"):
        ext.tree_attention_host(*args, 0)
    with pytest.raises(ValueError, match="head_dim"):
        ext.tree_attention_host(*args[:12], 96, *args[13:], 1)
    with pytest.raises(ValueError, match="words"):
        ext.tree_attention_host(*args[:14], 2, *args[15:], 1)


def test_bench_smoke(tmp_path):
    """bench/kernels/bench_attention.py --smoke runs here and writes its CSV + PNG."""
    script = Path(__file__).resolve().parents[1] / "bench" / "kernels" / "bench_attention.py"
    result = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "bench_attention.csv").exists()
    assert (tmp_path / "bench_attention.png").exists()
    methods = {line.split(",")[2] for line in (tmp_path / "bench_attention.csv").open()}
    assert {"triton", "triton_m32", "triton_m64", "triton_pm32", "triton_pm64",
            "triton_unordered", "triton_p1", "triton_p16", "triton_cap4x", "triton_s1",
            "triton_s4", "triton_decode", "triton_decode_pm64"} <= methods


# --------------------------------------------------------------------------------------------
# GPU: the full grid, both kernels
# --------------------------------------------------------------------------------------------

GPU_BACKENDS = ["triton", "cuda"]


def gpu_backend(backend):
    if backend == "cuda":
        pytest.importorskip("eagle_kernels._C")


@needs_gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", LOW, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("q_heads,kv_heads", [(32, 8), (9, 3)])
@pytest.mark.parametrize("prefix", [0, 1, 511, 4097])
@pytest.mark.parametrize("num_queries", [1, 7, 60, 64, 65, 128])
@pytest.mark.parametrize("batch", [1, 3])
def test_gpu_full_grid(gen, backend, dtype, head_dim, q_heads, kv_heads, prefix, num_queries,
                       batch):
    gpu_backend(backend)
    case = make_case(gen, batch, num_queries, prefix, q_heads, kv_heads, head_dim, dtype,
                     device="cuda")
    out = ops.tree_attention(*case, backend=backend)
    assert_flash_close(out, *case, num_queries, f"{backend} {seed_note(gen)}")


@needs_gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("num_splits", [1, 4, 32])
def test_gpu_forced_splits_and_draft_frontier(gen, backend, num_splits):
    gpu_backend(backend)
    launch = {"triton": attention_triton._tree_attention_triton,
              "cuda": attention._tree_attention_cuda}[backend]
    for num_queries, tree_keys in ((60, 60), (10, 70)):
        q, k, v, lens, mask = make_case(gen, 3, num_queries, 4097, 32, 8, 128, torch.bfloat16,
                                        tree_keys=tree_keys, device="cuda")
        out = launch(q, k, v, lens, mask, None, tree_keys, num_splits)
        assert_flash_close(out, q, k, v, lens, mask, tree_keys, f"{backend} {seed_note(gen)}")


@needs_gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", LOW, ids=["fp16", "bf16"])
def test_gpu_prefill_chain_equals_causal_sdpa(gen, backend, dtype):
    """Prefill: T = 3000 prompt keys under a chain mask == SDPA's causal attention."""
    gpu_backend(backend)
    tokens = 3000
    q, k, v, lens, mask = make_case(gen, 1, tokens, 0, 32, 8, 128, dtype,
                                    parents=chain_parents(1, tokens), device="cuda")
    out = ops.tree_attention(q, k, v, lens, mask, backend=backend)
    keys, values = (t[0, :tokens].repeat_interleave(4, 1).transpose(0, 1) for t in (k, v))
    want = F.scaled_dot_product_attention(q[0].transpose(0, 1).float(), keys.float(),
                                          values.float(), is_causal=True).transpose(0, 1)
    low = F.scaled_dot_product_attention(q[0].transpose(0, 1), keys, values,
                                         is_causal=True).transpose(0, 1)
    error = (out[0].float() - want).abs().max().item()
    assert error <= 2 * (low.float() - want).abs().max().item() + 1e-3, (backend, error)


@needs_gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_in_cuda_graph(gen, backend):
    gpu_backend(backend)
    q, k, v, lens, mask = make_case(gen, 8, 60, 1000, 32, 8, 128, torch.bfloat16, device="cuda")
    eager = ops.tree_attention(q, k, v, lens, mask, backend=backend)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(ops.tree_attention(q, k, v, lens, mask, backend=backend))
    # graph replays read the new lengths from the device: 7 fewer keys, none below 0 (make_case
    # draws lengths in [0, 1000]: P(one < 7) ~ 0.05), sequence 0 (1000 keys) always changed
    lens.sub_(7).clamp_(min=0)
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(out, eager)
    assert_flash_close(out, q, k, v, lens, mask, 60, f"{backend} {seed_note(gen)}")


@gpu_when_present
@pytest.mark.parametrize("backend", ["triton", "cuda", "cpu"])
def test_a_view_of_a_longer_cache_clamps_to_its_own_length(gen, backend):
    """A [1, L, H, D] view of a longer cache is contiguous to torch (the stride of a size-1
    dimension is ignored) and keeps the longer cache's batch stride. With value checks off, a
    prefix past L - T must clamp to L - T on it as on a cache of its own: the CUDA kernel took
    its max_len from the strides (stride_kb / stride_kn) and read the longer cache's rows."""
    from eagle_kernels.ops._backend import backend_status
    from eagle_kernels.ops._validate import no_value_checks

    if backend == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not backend_status(backend).available:
        pytest.skip(f"{backend} backend: {backend_status(backend).reason}")
    device = "cpu" if backend == "cpu" or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if backend == "cpu" else torch.float16
    length, nodes = 16, 3
    big_k, big_v = (torch.randn(1, 64, 2, 64, generator=gen).to(device, dtype) for _ in "kv")
    k, v = big_k[:, :length], big_v[:, :length]
    assert k.is_contiguous() and k.stride(0) != length * k.stride(1)
    q = torch.randn(1, nodes, 4, 64, generator=gen).to(device, dtype)
    mask = ops.pack_tree_mask(torch.tril(torch.ones(1, nodes, nodes, dtype=torch.bool)))
    mask = mask.to(device)
    with no_value_checks():
        got = ops.tree_attention(q, k, v, torch.tensor([40], dtype=torch.int32, device=device),
                                 mask, backend=backend)
    own = torch.tensor([length - nodes], dtype=torch.int32, device=device)
    want = ops.tree_attention(q, k.clone(), v.clone(), own, mask, backend=backend)
    assert torch.equal(got, want), (backend, seed_note(gen))
