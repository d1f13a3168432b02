"""Sampling CUDA kernels (csrc/sampling.cu): host twins == reference on CPU, backend="cuda" on GPU.

The ``*_host`` entry points run the kernels' own per-row / per-sequence code on CPU pointers.
Rather than restating the Triton tests, the ``host`` fixture swaps ``ops.target_probs`` /
``ops.stochastic_accept_tree`` / ``ops.stochastic_accept_chain`` for drop-ins that call the host
twins (any ``backend`` argument ignored), and the test bodies of test_acceptance.py (goldens,
invariants) and test_acceptance_kernels.py (reference comparisons, inputs drawn off the
reference's boundaries) run unchanged against them; the ``on_cuda`` fixture does the same with
``backend="cuda"`` on a GPU. The distribution tests are exact (bigram_harness.exact_reports).
"""

from __future__ import annotations

import functools

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference
from eagle_kernels.ops.sampling import sampling_arrays

import bigram_harness
import test_acceptance
import test_acceptance_kernels as kernel_tests
from conftest import random_parents
from cuda_support import DTYPE_CODES, SENTINEL, assert_guards, guarded, needs_gpu, seed_note
from test_acceptance_kernels import (SAMPLING, STOCHASTIC, chain_margin, compare_every_sequence,
                                     fragile_tokens, logits_off_top_p_boundaries, random_logits,
                                     top_p_fragile, tree_margin, node_probs,
                                     uniforms_off_boundaries)

OPS = ("target_probs", "stochastic_accept_tree", "stochastic_accept_chain")


def ptrs(*tensors):
    return [t.data_ptr() for t in tensors]


def sentinel_result(batch, width) -> reference.AcceptResult:
    return reference.AcceptResult(torch.full((batch, width), SENTINEL, dtype=torch.int64),
                                  torch.full((batch,), SENTINEL, dtype=torch.int32),
                                  torch.full((batch, width), SENTINEL, dtype=torch.int32))


def host_ops(ext) -> dict:
    """Drop-ins for the three ops that run the host twins on CPU copies of the inputs."""
    def cpu(*tensors):
        return [t.cpu().contiguous() if isinstance(t, torch.Tensor) else t for t in tensors]

    def target_probs(logits, temperature=1.0, top_k=0, top_p=1.0, backend=None):
        logits, temperature, top_k, top_p = cpu(logits, temperature, top_k, top_p)
        rows, vocab = logits.shape
        out = torch.full((rows, vocab), float(SENTINEL))
        params = sampling_arrays(temperature, top_k, top_p, rows, vocab, "cpu")
        ext.target_probs_host(logits.data_ptr(), out.data_ptr(), *ptrs(*params), rows, vocab,
                              DTYPE_CODES[logits.dtype])
        return out

    def stats(logits, temperature, top_k, top_p):
        batch, num_nodes, vocab = logits.shape
        params = sampling_arrays(temperature, top_k, top_p, batch, vocab, "cpu")
        found = [torch.full((batch * num_nodes,), SENTINEL, dtype=dtype)
                 for dtype in (torch.float32, torch.int32, torch.float32, torch.float32)]
        ext.row_stats_host(logits.data_ptr(), *ptrs(*found), *ptrs(*params), batch * num_nodes,
                           vocab, num_nodes, DTYPE_CODES[logits.dtype])
        return [*found, params[0]]

    def tree(tokens, parents, logits, accept_u, bonus_u, max_depth=None, temperature=1.0,
             top_k=0, top_p=1.0, backend=None):
        tokens, parents, logits, accept_u, bonus_u, temperature, top_k, top_p = cpu(
            tokens, parents, logits, accept_u, bonus_u, temperature, top_k, top_p)
        batch, num_nodes, vocab = logits.shape
        width = (num_nodes - 1 if max_depth is None else max_depth) + 1
        result = sentinel_result(batch, width)
        row_stats = stats(logits, temperature, top_k, top_p)  # alive until the call returns
        ext.stochastic_accept_tree_host(
            *ptrs(tokens, parents, logits, accept_u, bonus_u, *row_stats, *result),
            batch, num_nodes, vocab, width, DTYPE_CODES[logits.dtype])
        return result

    def chain(tokens, draft, logits, accept_u, bonus_u, temperature=1.0, top_k=0, top_p=1.0,
              backend=None):
        tokens, draft, logits, accept_u, bonus_u, temperature, top_k, top_p = cpu(
            tokens, draft, logits, accept_u, bonus_u, temperature, top_k, top_p)
        batch, num_nodes, vocab = logits.shape
        result = sentinel_result(batch, num_nodes)
        row_stats = stats(logits, temperature, top_k, top_p)
        ext.stochastic_accept_chain_host(
            *ptrs(tokens, draft, logits, accept_u, bonus_u, *row_stats, *result),
            batch, num_nodes, vocab, DTYPE_CODES[logits.dtype])
        return result

    return dict(zip(OPS, (target_probs, tree, chain)))


@pytest.fixture
def host(ext, monkeypatch):
    """ops.<op> -> the host twin drop-ins (see the module docstring)."""
    for name, fn in host_ops(ext).items():
        monkeypatch.setattr(ops, name, fn)


@pytest.fixture
def on_cuda(ext, monkeypatch):
    """ops.<op> -> the real op on GPU copies of the tensors with backend="cuda", whatever
    backend the caller asked for."""
    def gpu(value):
        return value.cuda() if isinstance(value, torch.Tensor) else value

    for name in OPS:
        def forced(*args, _op=getattr(ops, name), backend=None, **kwargs):
            return _op(*map(gpu, args), backend="cuda",
                       **{key: gpu(value) for key, value in kwargs.items()})
        monkeypatch.setattr(ops, name, forced)


# ---- CPU: the host twins ---------------------------------------------------------------------


@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: "-".join(map(str, p.items())) or "t1")
def test_host_target_probs_matches_reference(host, gen, params):
    for _ in range(10):
        kernel_tests.test_target_probs_matches_reference(gen, params)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_host_target_probs_half_dtypes(host, gen, dtype):
    kernel_tests.test_target_probs_per_row_parameters(gen)  # float16 logits, per-row params
    logits = (torch.randn(8, 500, generator=gen) * 3).to(dtype)
    params = dict(temperature=0.8, top_k=40, top_p=0.9)
    got, want = ops.target_probs(logits, **params), reference.target_probs(logits, **params)
    fragile, _ = fragile_tokens(logits, *params.values())
    assert torch.equal((got > 0)[~fragile], (want > 0)[~fragile]), seed_note(gen)
    heavy = top_p_fragile(logits, *params.values())
    torch.testing.assert_close(got[~heavy], want[~heavy], rtol=1e-5, atol=1e-6)


def test_host_goldens_and_invariants(host, gen):
    """The goldens and invariants of test_acceptance.py and test_acceptance_kernels.py."""
    test_acceptance.test_stochastic_tree_golden()
    test_acceptance.test_stochastic_chain_golden()
    test_acceptance.test_one_hot_target_stochastic_tree_accepts_whole_path(gen)
    test_acceptance.test_target_probs_temperature_top_k_top_p()
    test_acceptance.test_top_p_one_disables_top_p_exactly()
    kernel_tests.test_stochastic_goldens()
    kernel_tests.test_invariants_one_hot_target_accepts_all_and_suffix_is_minus_one(gen)


@pytest.mark.parametrize("params,batch", STOCHASTIC, ids=["t1", "t0.7", "t0.5-k10-p0.6"])
def test_host_stochastic_tree_matches_reference(host, gen, params, batch):
    for _ in range(30):
        kernel_tests.test_stochastic_tree_matches_reference(gen, params, batch)


@pytest.mark.parametrize("params,batch", STOCHASTIC, ids=["t1", "t0.7", "t0.5-k10-p0.6"])
def test_host_stochastic_chain_matches_reference(host, gen, params, batch):
    for _ in range(30):
        kernel_tests.test_stochastic_chain_matches_reference(gen, params, batch)


def test_host_never_emits_zero_probability(host, gen):
    """Sparse targets and extreme bonus uniforms (0 and the largest float below 1): the bonus
    token always has positive probability at its node and is never a rejected sibling."""
    batch, num_nodes, vocab = 16, 9, 50
    parents = random_parents(batch, num_nodes, gen)
    tokens = torch.randint(0, 6, (batch, num_nodes), generator=gen)
    logits = random_logits(batch, num_nodes, vocab, gen)
    logits[torch.rand(batch, num_nodes, vocab, generator=gen) < 0.7] = float("-inf")
    logits[..., 2] = 0.0  # every row keeps a finite logit
    probs = reference._node_probs(logits, 1.0, 0, 1.0)
    for u in (0.0, float.fromhex("0x1.fffffep-1")):
        bonus_u = torch.full((batch,), u)
        result = ops.stochastic_accept_tree(tokens, parents, logits,
                                            torch.rand(batch, num_nodes, generator=gen), bonus_u)
        for b in range(batch):
            count = int(result.num_accepted[b])
            node, bonus = int(result.accepted_nodes[b, count]), int(result.output_tokens[b, count])
            assert float(probs[b, node, bonus]) > 0, seed_note(gen)
            assert bonus not in tokens[b][parents[b] == node].tolist(), seed_note(gen)
        draft = torch.softmax(random_logits(batch, num_nodes - 1, vocab, gen), -1)
        chain = ops.stochastic_accept_chain(tokens, draft, logits,
                                            torch.rand(batch, num_nodes, generator=gen), bonus_u)
        for b in range(batch):
            count = int(chain.num_accepted[b])
            bonus = int(chain.output_tokens[b, count])
            # bonus row: node `count` (all accepted, or node count + 1 rejected)
            assert float(probs[b, count, bonus]) > 0, seed_note(gen)


def exact_check(gen, kind, op, device):
    """The exact emitted-token distributions of the two-cycle bigram harness (see
    bigram_harness.exact_reports: no draws, so no false failures; any sampler off by more than
    ~1e-3 in total variation fails), every parameter set in one batched call."""
    params_list = kernel_tests.EXACT_PARAMS
    target, draft = bigram_harness.exact_tables(gen, params_list)
    reports = bigram_harness.exact_reports(kind, op, target, draft, params_list, device=device)
    for params, report in zip(params_list, reports):
        assert bigram_harness.exact_ok(report), f"{params}: {report} {seed_note(gen)}"


@pytest.mark.parametrize("kind", ["tree", "chain"])
def test_host_emitted_tokens_follow_the_target_exactly(host, gen, kind):
    """The CUDA kernels' own code run natively on the host: first token and the joint of the
    first two exactly the target's, for temperature / top-k / top-p and combinations."""
    op = ops.stochastic_accept_tree if kind == "tree" else ops.stochastic_accept_chain
    exact_check(gen, kind, op, "cpu")


def test_host_outputs_stay_in_bounds(ext, gen):
    """max_depth beyond the tree depth: widths past N, nothing written outside the outputs."""
    batch, num_nodes, vocab, width = 3, 5, 20, 9
    tree = host_ops(ext)["stochastic_accept_tree"]
    parents = random_parents(batch, num_nodes, gen)
    tokens = torch.randint(0, 4, (batch, num_nodes), generator=gen)
    logits = random_logits(batch, num_nodes, vocab, gen)
    # compared exactly: the draws off the reference's fp64 boundaries, as in the other checks
    margin = functools.partial(tree_margin, tokens, parents, node_probs(logits, {}))
    args = (tokens, parents, logits, *uniforms_off_boundaries(batch, num_nodes, margin, gen))
    want = reference.stochastic_accept_tree(*args, max_depth=width - 1)
    got = tree(*args, max_depth=width - 1)
    assert all(torch.equal(a, e) for a, e in zip(got, want)), seed_note(gen)
    outputs = [guarded((batch, width), torch.int64), guarded((batch,), torch.int32),
               guarded((batch, width), torch.int32)]
    stats = [torch.zeros(batch * num_nodes, dtype=d)
             for d in (torch.float32, torch.int32, torch.float32, torch.float32)]
    temperature, top_k, top_p = sampling_arrays(1.0, 0, 1.0, batch, vocab, "cpu")
    ext.row_stats_host(args[2].data_ptr(), *ptrs(*stats), *ptrs(temperature, top_k, top_p),
                       batch * num_nodes, vocab, num_nodes, 0)
    ext.stochastic_accept_tree_host(*ptrs(*args, *stats, temperature),
                                    *(inner.data_ptr() for _, inner in outputs), batch,
                                    num_nodes, vocab, width, 0)
    for buffer, _ in outputs:
        assert_guards(buffer, seed_note(gen))
    with pytest.raises(ValueError):
        ext.stochastic_accept_tree_host(*ptrs(*args, *stats, temperature),
                                        *(inner.data_ptr() for _, inner in outputs), batch,
                                        5000, vocab, width, 0)


def check_stochastic_matches_torch(gen, dtype, vocab, params, device):
    """Tree and chain acceptance through ops.* (backend="cuda", or the host drop-ins) vs the
    torch backend (reference.*) on the same device, every sequence compared exactly: draws off
    the reference's boundaries, logit rows off top-p's."""
    batch, num_nodes = 8, 7
    parents = random_parents(batch, num_nodes, gen)
    tokens = torch.randint(0, 6, (batch, num_nodes), generator=gen)
    logits = logits_off_top_p_boundaries(
        lambda g: random_logits(batch, num_nodes, vocab, g).to(dtype), params, gen)
    draft = torch.softmax(random_logits(batch, num_nodes - 1, vocab, gen), -1)
    probs = node_probs(logits, params)

    def both_margins(accept_u, bonus_u, b):  # the same draws run both ops
        return min(tree_margin(tokens, parents, probs, accept_u, bonus_u, b),
                   chain_margin(tokens, draft, probs, accept_u, bonus_u, b))

    accept_u, bonus_u = uniforms_off_boundaries(batch, num_nodes, both_margins, gen)
    for op, torch_op, second, margin in (
            (ops.stochastic_accept_tree, reference.stochastic_accept_tree, parents, tree_margin),
            (ops.stochastic_accept_chain, reference.stochastic_accept_chain, draft,
             chain_margin)):
        args = [a.to(device) for a in (tokens, second, logits, accept_u, bonus_u)]
        got = op(*args, **params, backend="cuda")
        want = reference.AcceptResult(*(w.cpu() for w in torch_op(*args, **params)))
        margins = [margin(tokens, second, probs, accept_u, bonus_u, b) for b in range(batch)]
        compare_every_sequence(got, want, margins, f"vocab {vocab} {seed_note(gen)}")


@pytest.mark.parametrize("vocab,params", [(32000, {"temperature": 0.7, "top_k": 50,
                                                   "top_p": 0.9}), (5000, {"top_k": 200,
                                                                           "top_p": 0.8})],
                         ids=["32000-t0.7-k50-p0.9", "5000-k200-p0.8"])
def test_host_large_vocab_matches_reference(host, gen, vocab, params):
    check_stochastic_matches_torch(gen, torch.bfloat16, vocab, params, "cpu")


# ---- GPU: backend="cuda" ---------------------------------------------------------------------

VOCABS = [(32000, {}), (128256, {"temperature": 0.7, "top_p": 0.9}), (151936, {"top_k": 50}),
          (32000, {"temperature": 0.5, "top_k": 10, "top_p": 0.6})]


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab,params", VOCABS, ids=lambda v: str(v))
def test_gpu_target_probs_matches_torch(ext, gen, dtype, vocab, params):
    """Every row compared: rows with a fragile top-p step (fp16 / bf16 ties) drawn again."""
    logits = logits_off_top_p_boundaries(
        lambda g: (torch.randn(6, vocab, generator=g) * 3).to(dtype), params, gen)
    got = ops.target_probs(logits.cuda(), **params, backend="cuda").cpu()
    want = ops.target_probs(logits.cuda(), **params, backend="torch").cpu()
    args = (params.get("temperature", 1.0), params.get("top_k", 0), params.get("top_p", 1.0))
    fragile, _ = fragile_tokens(logits, *args)  # lighter than NEAR: only their own support
    assert torch.equal((got > 0)[~fragile], (want > 0)[~fragile]), seed_note(gen)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6,
                               msg=lambda text: f"{text}\n{seed_note(gen)}")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab,params", VOCABS, ids=lambda v: str(v))
def test_gpu_stochastic_matches_torch(ext, gen, dtype, vocab, params):
    check_stochastic_matches_torch(gen, dtype, vocab, params, "cuda")


@needs_gpu
def test_gpu_kernel_tests(on_cuda, gen):
    """The reference comparisons and goldens of the Triton tests, through backend="cuda"."""
    test_acceptance.test_stochastic_tree_golden()
    test_acceptance.test_stochastic_chain_golden()
    kernel_tests.test_stochastic_goldens()
    for params in SAMPLING:
        kernel_tests.test_target_probs_matches_reference(gen, params)
    for params, batch in STOCHASTIC:
        kernel_tests.test_stochastic_tree_matches_reference(gen, params, batch * 4)
        kernel_tests.test_stochastic_chain_matches_reference(gen, params, batch * 4)


@needs_gpu
def test_gpu_stochastic_tree_in_cuda_graph(ext, gen):
    """Capture row stats + acceptance (parameter arrays included) in a CUDA graph, replay."""
    batch, num_nodes, vocab = 4, 9, 1000
    parents = random_parents(batch, num_nodes, gen).cuda()
    tokens = torch.randint(0, 6, (batch, num_nodes), generator=gen).cuda()
    logits = random_logits(batch, num_nodes, vocab, gen).cuda()
    accept_u = torch.rand(batch, num_nodes, generator=gen).cuda()
    bonus_u = torch.rand(batch, generator=gen).cuda()
    args = (tokens, parents, logits, accept_u, bonus_u)
    params = dict(temperature=0.7, top_k=torch.tensor([0, 5, 50, 1000]).cuda(), top_p=0.9)
    ops.stochastic_accept_tree(*args, **params, backend="cuda")  # warm up: load the kernels
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = ops.stochastic_accept_tree(*args, **params, backend="cuda")
    for _ in range(3):
        logits.copy_(random_logits(batch, num_nodes, vocab, gen))
        accept_u.copy_(torch.rand(batch, num_nodes, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        again = ops.stochastic_accept_tree(*args, **params, backend="cuda")
        assert all(torch.equal(a, b) for a, b in zip(captured, again)), seed_note(gen)


@needs_gpu
@pytest.mark.parametrize("kind", ["tree", "chain"])
def test_gpu_emitted_tokens_follow_the_target_exactly(ext, gen, kind):
    op = functools.partial(ops.stochastic_accept_tree if kind == "tree"
                           else ops.stochastic_accept_chain, backend="cuda")
    exact_check(gen, kind, op, "cuda")
