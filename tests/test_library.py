"""torch.library registrations (eagle_kernels/ops/library.py): torch.ops.eagle_kernels.*.

Every public op passes ``torch.library.opcheck`` on small CPU inputs with the torch backend
(schema and mutation annotations, fake implementation against the real one, AOT dispatch with
dynamic shapes), returns what the plain Python function returns, and a few ops chained under
``torch.compile(fullgraph=True)`` trace without a graph break and match eager.
"""

from __future__ import annotations

import pytest
import torch

import eagle_kernels.ops as ops
from eagle_kernels.ops.library import OPS

from conftest import BASE_SEED

lib = torch.ops.eagle_kernels
VOCAB = 50
PARENTS = [[-1, 0, 0, 1, 1, 2, 3], [-1, 0, 1, 2, 0, 4, 4]]


def _gen():
    """The run's seed (EAGLE_TEST_SEED replays it): the cases are drawn at import, before any
    test's own generator, and every check here holds for any draw (the same op on the same
    inputs, schema and fake-tensor checks)."""
    return torch.Generator().manual_seed(BASE_SEED)


def tree_inputs(gen):
    parents = torch.tensor(PARENTS, dtype=torch.int32)
    depth, tree_mask, paths = ops.build_tree(parents, backend="torch")
    tokens = torch.randint(0, VOCAB, parents.shape, generator=gen)
    logits = torch.randn(*parents.shape, VOCAB, generator=gen)
    return parents, tree_mask, paths, tokens, logits


def attention_inputs(gen):
    parents, tree_mask, *_ = tree_inputs(gen)
    batch, nodes = parents.shape
    q = torch.randn(batch, nodes, 4, 16, generator=gen)
    k_cache = torch.randn(batch, 32, 2, 16, generator=gen)
    v_cache = torch.randn(batch, 32, 2, 16, generator=gen)
    cache_lens = torch.tensor([5, 9], dtype=torch.int32)
    return q, k_cache, v_cache, cache_lens, tree_mask


def rerank_inputs(gen):
    parents = [-1, -1, -1, 0, 0, 1, 3, 3]
    scores = []
    for parent in parents:
        base = scores[parent] if parent >= 0 else 0.0
        scores.append(base - float(torch.rand((), generator=gen)) - 0.01)
    batch = 2
    candidate_parents = torch.tensor([parents] * batch, dtype=torch.int32)
    candidate_scores = torch.tensor([scores] * batch, dtype=torch.float32)
    candidate_scores[1] -= torch.rand(len(parents), generator=gen) * 0.001 * torch.arange(8)
    candidate_tokens = torch.randint(0, VOCAB, (batch, len(parents)), generator=gen)
    root_tokens = torch.randint(0, VOCAB, (batch,), generator=gen)
    return root_tokens, candidate_tokens, candidate_scores, candidate_parents


def sampling_inputs(gen, batch, nodes):
    return (torch.rand(batch, nodes, generator=gen), torch.rand(batch, generator=gen))


def cases():
    """(op name, args, kwargs) of every registered op."""
    gen = _gen()
    parents, tree_mask, paths, tokens, logits = tree_inputs(gen)
    accept_u, bonus_u = sampling_inputs(gen, *tokens.shape)
    chain_tokens, chain_logits = tokens[:, :5].contiguous(), logits[:, :5].contiguous()
    draft_probs = torch.softmax(torch.randn(2, 4, VOCAB, generator=gen), -1)
    per_seq = dict(temperatures=torch.tensor([0.7, 1.3]), top_ks=torch.tensor([0, 5]),
                   top_ps=torch.tensor([0.9, 1.0]))
    x = torch.randn(2, 3, 16, generator=gen)
    weights = [torch.randn(8, 16, generator=gen), torch.randn(4, 16, generator=gen)]
    bias = torch.randn(8, generator=gen)
    positions = torch.tensor([[0, 4, 9]])
    angles = torch.arange(10.0).unsqueeze(1) * torch.tensor([1.0, 0.1, 0.01, 0.001]).repeat(2)
    caches = [torch.randn(2, 16, 2, 4, generator=gen), torch.randn(2, 16, 1, 8, generator=gen)]
    torch_backend = {"backend": "torch"}
    return [
        ("tree_attention", attention_inputs(gen), torch_backend),
        ("tree_attention", attention_inputs(gen), dict(sm_scale=0.3, num_tree_keys=7,
                                                       backend="torch")),
        ("topk_log_softmax", (torch.randn(6, VOCAB, generator=gen), 4), torch_backend),
        ("topk_log_softmax", (torch.randn(6, VOCAB, generator=gen), 3),
         dict(d2t=torch.arange(VOCAB) % 3, backend="torch")),
        ("eagle2_expand", (torch.randn(2, 3, generator=gen),
                           torch.randn(2, 3, 4, generator=gen).sort(-1, descending=True).values,
                           5), torch_backend),
        ("eagle2_rerank", (*rerank_inputs(gen), 5), torch_backend),
        ("eagle2_rerank", (*rerank_inputs(gen), 6), dict(max_depth=4, backend="torch")),
        ("build_tree", (parents,), torch_backend),
        ("build_tree", (parents,), dict(max_depth=3, backend="torch")),
        ("greedy_accept_tree", (tokens, paths, logits), torch_backend),
        ("greedy_accept_chain", (chain_tokens, chain_logits), torch_backend),
        ("stochastic_accept_tree", (tokens, parents, logits, accept_u, bonus_u),
         dict(temperature=0.8, top_k=10, top_p=0.9, backend="torch")),
        ("stochastic_accept_tree", (tokens, parents, logits, accept_u, bonus_u),
         dict(max_depth=4, **per_seq, backend="torch")),
        ("stochastic_accept_chain", (chain_tokens, draft_probs, chain_logits,
                                     accept_u[:, :5].contiguous(), bonus_u), torch_backend),
        ("target_probs", (logits[0],), dict(temperature=0.5, top_k=7, top_p=0.8,
                                            backend="torch")),
        ("target_probs", (logits[0, :2].contiguous(),), dict(**per_seq, backend="torch")),
        ("compact_kv", (caches, torch.tensor([3, 5], dtype=torch.int32),
                        torch.tensor([[0, 2, 5, -1], [0, -1, -1, -1]], dtype=torch.int32),
                        torch.tensor([2, 0], dtype=torch.int32)), torch_backend),
        ("write_kv", (*(torch.randn(2, 3, 2, 4, generator=gen) for _ in range(2)),
                      *(torch.randn(2, 16, 2, 4, generator=gen) for _ in range(2)),
                      torch.tensor([3, 9], dtype=torch.int32)), dict(offset=2, backend="torch")),
        ("soft_cross_entropy", (torch.randn(4, 30, generator=gen).requires_grad_(),
                                torch.randn(4, 30, generator=gen)), torch_backend),
        ("linear", (x, weights[0], bias), torch_backend),
        ("linear", (x, weights[1]), torch_backend),
        ("linear_group", (x, weights, [bias, None]), torch_backend),
        ("rms_norm", (x, torch.rand(16, generator=gen), 1e-6), torch_backend),
        ("rms_norm_residual", (x, torch.randn(x.shape, generator=gen),
                               torch.rand(16, generator=gen), 1e-6), torch_backend),
        ("silu_mul", (x, torch.randn(2, 3, 16, generator=gen)), torch_backend),
        ("apply_rope", (torch.randn(1, 3, 2, 8, generator=gen), positions, angles.cos(),
                        angles.sin()), torch_backend),
        ("rope_write_kv", (torch.randn(1, 3, 4, 8, generator=gen),
                           *(torch.randn(1, 3, 2, 8, generator=gen) for _ in range(2)), positions,
                           angles.cos(), angles.sin(),
                           *(torch.randn(1, 12, 2, 8, generator=gen) for _ in range(2)),
                           torch.tensor([5], dtype=torch.int32)), dict(offset=1, backend="torch")),
        # backend="auto": the fastest backend here (the C++ CPU kernels where built)
        ("tree_attention", attention_inputs(gen), {}),
        ("linear_group", (x, weights, [bias, None]), {}),
        ("rms_norm_residual", (x, torch.randn(x.shape, generator=gen),
                               torch.rand(16, generator=gen), 1e-6), {}),
        ("apply_rope", (torch.randn(1, 3, 2, 8, generator=gen), positions, angles.cos(),
                        angles.sin()), {}),
    ]


CASES = cases()


def test_every_public_op_is_registered_and_tested():
    assert {name for name, _, _ in CASES} == set(OPS)
    for name in OPS:
        assert hasattr(lib, name), name


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)])
def test_opcheck(index):
    name, args, kwargs = CASES[index]
    torch.library.opcheck(getattr(lib, name).default, args, kwargs)


def _plain(name, args, kwargs):
    """The plain Python op's result as the custom op returns it (NamedTuples flattened)."""
    kwargs = dict(kwargs)
    if name == "rms_norm_residual":
        x, residual, weight, eps = args
        return ops.rms_norm(x, weight, eps, residual, **kwargs)
    for scalar, tensor in (("temperature", "temperatures"), ("top_k", "top_ks"),
                           ("top_p", "top_ps")):
        if tensor in kwargs:
            kwargs[scalar] = kwargs.pop(tensor)
    result = getattr(ops, name)(*args, **kwargs)
    if name == "eagle2_rerank":
        return (*result[0], result[1])
    return result


def _with_fresh_caches(name, args):
    """An in-place op's arguments with the caches it writes cloned, and those clones."""
    if name == "compact_kv":  # one list of caches
        caches = [c.clone() for c in args[0]]
        return (caches, *args[1:]), caches
    first = 6 if name == "rope_write_kv" else 2  # (q, k, v, positions, cos, sin) or (k, v)
    caches = [c.clone() for c in args[first:first + 2]]  # k_cache, v_cache
    return (*args[:first], *caches, *args[first + 2:]), caches


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)])
def test_custom_op_equals_plain_function(index):
    name, args, kwargs = CASES[index]
    if name in ("compact_kv", "write_kv", "rope_write_kv"):  # in place: compare the caches
        got_args, got = _with_fresh_caches(name, args)
        want_args, want = _with_fresh_caches(name, args)
        want_out = getattr(ops, name)(*want_args, **kwargs)
        got_out = getattr(lib, name)(*got_args, **kwargs)
        assert (got_out is None) == (want_out is None)  # rope_write_kv returns the rotated q
        returned = [(got_out, want_out)] if want_out is not None else []
        for g, w in returned + list(zip(got, want)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        return
    got = getattr(lib, name)(*args, **kwargs)
    want = _plain(name, args, kwargs)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.detach(), rtol=0, atol=0)


def test_soft_cross_entropy_gradient_matches_the_plain_op():
    gen = _gen()
    draft = torch.randn(5, 40, generator=gen)
    draft[0, :3] = float("-inf")
    target = torch.randn(5, 40, generator=gen)
    target[1, 5:] = float("-inf")
    weights = torch.rand(5, generator=gen)
    grads = []
    for fn in (lib.soft_cross_entropy, ops.soft_cross_entropy):
        x = draft.clone().requires_grad_()
        (fn(x, target, backend="torch") * weights).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1])


def verify_step(parents, q, k_cache, v_cache, cache_lens, tokens, target_logits):
    """Somebody's decoding step written against torch.ops.eagle_kernels."""
    depth, tree_mask, paths = lib.build_tree(parents, backend="torch")
    attended = lib.tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, backend="torch")
    logits = target_logits + attended.sum((2, 3)).unsqueeze(-1) * 0.01
    output_tokens, num_accepted, accepted_nodes = lib.greedy_accept_tree(
        tokens, paths, logits, backend="torch")
    lib.compact_kv([k_cache, v_cache], cache_lens, accepted_nodes, num_accepted,
                   backend="torch")
    return output_tokens, num_accepted, depth * 2, attended


def _verify_inputs():
    gen = _gen()
    parents, _, _, tokens, logits = tree_inputs(gen)
    q, k_cache, v_cache, cache_lens, _ = attention_inputs(gen)
    return parents, q, k_cache, v_cache, cache_lens, tokens, logits


def test_compiled_chain_of_ops_has_no_graph_break_and_matches_eager():
    torch._dynamo.reset()
    eager_inputs, compiled_inputs = _verify_inputs(), _verify_inputs()
    want = verify_step(*eager_inputs)
    explained = torch._dynamo.explain(verify_step)(*_verify_inputs())
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(verify_step, fullgraph=True, backend="aot_eager")
    got = compiled(*compiled_inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    for g, w in zip(compiled_inputs[2:4], eager_inputs[2:4]):  # compact_kv's in-place moves
        torch.testing.assert_close(g, w, rtol=0, atol=0)
