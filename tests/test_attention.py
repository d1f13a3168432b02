"""tree_attention reference: golden visibility, chain == causal, N=1 == decode, bad inputs."""

import pytest
import torch
import torch.nn.functional as F

from eagle_kernels import ops

from conftest import chain_parents, random_parents
from cuda_support import gpu_when_present


def make_cache(batch, max_len, kv_heads, head_dim, gen, dtype=torch.float32):
    k = torch.randn(batch, max_len, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, max_len, kv_heads, head_dim, generator=gen).to(dtype)
    return k, v


def test_golden_visibility_with_uniform_weights(gen):
    # Zero keys make every visible key equally likely, so the output is the mean of the
    # visible values: value at position t is t, which reveals exactly which keys were seen.
    parents = torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32)
    _, mask, _ = ops.build_tree(parents)
    prefix, num_nodes = 3, 4
    q = torch.randn(1, num_nodes, 2, 4, generator=gen)
    k = torch.zeros(1, 10, 1, 4)
    v = torch.arange(10, dtype=torch.float32).view(1, 10, 1, 1).expand(1, 10, 1, 4).contiguous()
    out = ops.tree_attention(q, k, v, torch.tensor([prefix], dtype=torch.int32), mask)
    # prefix 0,1,2 always; node j sits at 3 + j. Node 3 sees nodes 0, 1, 3.
    expected = [sum([0, 1, 2, 3]) / 4, sum([0, 1, 2, 3, 4]) / 5, sum([0, 1, 2, 3, 5]) / 5,
                sum([0, 1, 2, 3, 4, 6]) / 6]
    torch.testing.assert_close(out[0, :, :, 0], torch.tensor(expected).view(4, 1).expand(4, 2))


def causal_attention(q, k, v, prefix):
    """Plain causal attention of the last N positions of a sequence, SDPA with explicit mask."""
    num_queries = q.shape[0]
    group = q.shape[1] // k.shape[1]
    keys = k[: prefix + num_queries].repeat_interleave(group, 1).transpose(0, 1).float()
    values = v[: prefix + num_queries].repeat_interleave(group, 1).transpose(0, 1).float()
    mask = torch.ones(num_queries, prefix + num_queries, dtype=torch.bool).tril(prefix)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).float(), keys, values, attn_mask=mask)
    return out.transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("q_heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 16), (8, 2, 32)])
def test_chain_tree_equals_causal_attention(gen, dtype, q_heads, kv_heads, head_dim):
    batch, num_nodes, max_len = 3, 37, 128
    prefix = torch.tensor([0, 1, 70], dtype=torch.int32)
    k, v = make_cache(batch, max_len, kv_heads, head_dim, gen, dtype)
    q = torch.randn(batch, num_nodes, q_heads, head_dim, generator=gen).to(dtype)
    _, mask, _ = ops.build_tree(chain_parents(batch, num_nodes))
    out = ops.tree_attention(q, k, v, prefix, mask)
    assert out.dtype == dtype and out.shape == q.shape
    for b in range(batch):
        expected = causal_attention(q[b], k[b], v[b], int(prefix[b])).to(dtype)
        torch.testing.assert_close(out[b], expected)


def test_single_node_equals_decode_attention(gen):
    batch, max_len, q_heads, kv_heads, head_dim = 2, 50, 6, 2, 8
    k, v = make_cache(batch, max_len, kv_heads, head_dim, gen)
    q = torch.randn(batch, 1, q_heads, head_dim, generator=gen)
    lens = torch.tensor([0, 41], dtype=torch.int32)
    mask = torch.ones(batch, 1, 1, dtype=torch.int32)
    out = ops.tree_attention(q, k, v, lens, mask)
    for b in range(batch):
        length = int(lens[b]) + 1
        keys = k[b, :length].repeat_interleave(3, 1)
        logits = torch.einsum("hd,khd->hk", q[b, 0], keys) / head_dim**0.5
        expected = torch.einsum("hk,khd->hd", logits.softmax(-1),
                                v[b, :length].repeat_interleave(3, 1))
        torch.testing.assert_close(out[b, 0], expected)


def test_gqa_equals_repeated_kv_heads(gen):
    batch, num_nodes, max_len = 2, 9, 40
    parents = random_parents(batch, num_nodes, gen)
    _, mask, _ = ops.build_tree(parents)
    k, v = make_cache(batch, max_len, 2, 16, gen)
    q = torch.randn(batch, num_nodes, 8, 16, generator=gen)
    lens = torch.tensor([5, 30], dtype=torch.int32)
    grouped = ops.tree_attention(q, k, v, lens, mask)
    full = ops.tree_attention(q, k.repeat_interleave(4, 2).contiguous(),
                              v.repeat_interleave(4, 2).contiguous(), lens, mask)
    torch.testing.assert_close(grouped, full)


def test_draft_frontier_queries_over_more_tree_keys(gen):
    # Drafting: 2 frontier queries (tree nodes 3 and 4) over 5 drafted keys. Must equal the
    # rows of the full 5-query verify call.
    parents = torch.tensor([[-1, 0, 0, 1, 2]], dtype=torch.int32)
    _, mask, _ = ops.build_tree(parents)
    k, v = make_cache(1, 20, 1, 8, gen)
    q = torch.randn(1, 5, 2, 8, generator=gen)
    lens = torch.tensor([7], dtype=torch.int32)
    full = ops.tree_attention(q, k, v, lens, mask)
    frontier = ops.tree_attention(q[:, 3:].contiguous(), k, v, lens, mask[:, 3:].contiguous(),
                                  num_tree_keys=5)
    torch.testing.assert_close(frontier, full[:, 3:])


@gpu_when_present
@pytest.mark.parametrize("backend", ["torch", "triton", "cpu"])
@pytest.mark.parametrize("batch,q_heads", [(0, 4), (1, 0)], ids=["no-batch", "no-heads"])
def test_no_query_is_an_empty_output(backend, batch, q_heads):
    """Nothing to attend: an empty output on every backend (Triton divided by Hq / GROUP)."""
    from eagle_kernels.ops._backend import backend_status

    if not backend_status(backend).available:
        pytest.skip(f"{backend}: {backend_status(backend).reason}")
    device = "cuda" if backend != "cpu" and torch.cuda.is_available() else "cpu"
    q = torch.zeros(batch, 2, q_heads, 8, device=device)
    k = torch.zeros(batch, 8, 1, 8, device=device)
    mask = torch.ones(batch, 2, 1, dtype=torch.int32, device=device)
    out = ops.tree_attention(q, k, k.clone(), torch.zeros(batch, dtype=torch.int32,
                                                         device=device), mask, backend=backend)
    assert out.shape == q.shape


def test_query_seeing_nothing_gets_zeros():
    q, k, v = torch.ones(1, 1, 1, 4), torch.ones(1, 4, 1, 4), torch.ones(1, 4, 1, 4)
    out = ops.tree_attention(q, k, v, torch.tensor([0], dtype=torch.int32),
                             torch.zeros(1, 1, 1, dtype=torch.int32))
    assert torch.equal(out, torch.zeros_like(out))


def test_bad_inputs(gen):
    k, v = make_cache(1, 16, 2, 8, gen)
    q = torch.randn(1, 3, 4, 8)
    lens = torch.tensor([4], dtype=torch.int32)
    mask = torch.tensor([[[1], [3], [5]]], dtype=torch.int32)
    ops.tree_attention(q, k, v, lens, mask)  # valid
    with pytest.raises(ValueError, match="q: expected dtype"):
        ops.tree_attention(q.double(), k, v, lens, mask)
    with pytest.raises(ValueError, match="k_cache: expected dtype float16"):
        ops.tree_attention(q.half(), k, v, lens, mask)
    with pytest.raises(ValueError, match="k_cache: expected a KV head count"):
        ops.tree_attention(torch.randn(1, 3, 3, 8), k, v, lens, mask)
    with pytest.raises(ValueError, match=r"v_cache: expected shape \[1, 16, 2, 8\]"):
        ops.tree_attention(q, k, v[:, :8].contiguous(), lens, mask)
    with pytest.raises(ValueError, match="cache_lens: expected dtype int32"):
        ops.tree_attention(q, k, v, lens.long(), mask)
    with pytest.raises(ValueError, match="cache_lens: expected values in"):
        ops.tree_attention(q, k, v, torch.tensor([14], dtype=torch.int32), mask)
    with pytest.raises(ValueError, match=r"tree_mask: expected shape \[1, 3, 1\]"):
        ops.tree_attention(q, k, v, lens, mask[:, :2].contiguous())
    with pytest.raises(ValueError, match="tree_mask: bits past the 3 tree keys"):
        ops.tree_attention(q, k, v, lens, mask | 8)
    with pytest.raises(ValueError, match="k_cache: expected a tensor on cpu"):
        ops.tree_attention(q, k.to("meta"), v, lens, mask)
    with pytest.raises(ValueError, match="q: expected a contiguous"):
        ops.tree_attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, lens, mask)
