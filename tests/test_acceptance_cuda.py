"""Greedy acceptance CUDA kernels (csrc/acceptance.cu): host twins == reference, bounds, GPU.

``argmax_rows_host`` and ``greedy_accept_paths_host`` run the kernels' own per-row / per-path
code on CPU pointers (how CI proves them equal to the reference); the GPU tests run the real
launchers through ``ops.greedy_accept_tree(..., backend="cuda")`` when a GPU is present.
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference

from conftest import SHAPES, random_parents
from cuda_support import (DTYPE_CODES, SENTINEL, assert_guards, assert_same, guarded, needs_gpu,
                          seed_note)


def host_greedy_accept(ext, tokens, paths, logits) -> reference.AcceptResult:
    batch, num_nodes, vocab = logits.shape
    _, num_paths, width = paths.shape
    target_ids = torch.full((batch, num_nodes), SENTINEL, dtype=torch.int64)
    ext.argmax_rows_host(logits.data_ptr(), target_ids.data_ptr(), batch * num_nodes, vocab,
                         DTYPE_CODES[logits.dtype])
    result = reference.AcceptResult(torch.full((batch, width), SENTINEL, dtype=torch.int64),
                                    torch.full((batch,), SENTINEL, dtype=torch.int32),
                                    torch.full((batch, width), SENTINEL, dtype=torch.int32))
    ext.greedy_accept_paths_host(tokens.data_ptr(), paths.data_ptr(), target_ids.data_ptr(),
                                 result.output_tokens.data_ptr(), result.num_accepted.data_ptr(),
                                 result.accepted_nodes.data_ptr(), batch, num_nodes, num_paths,
                                 width)
    return result


def planted_acceptance(parents, vocab: int, gen: torch.Generator, max_depth: int | None = None):
    """tokens, paths and fp32 logits whose argmax follows a random path for a random length.

    A small vocabulary makes accidental matches, hence ties between paths, common."""
    batch, num_nodes = parents.shape
    _, _, paths = reference.build_tree(parents, max_depth)
    tokens = torch.randint(0, vocab, (batch, num_nodes), generator=gen)
    target = torch.randint(0, vocab, (batch, num_nodes), generator=gen)
    for b in range(batch):
        leaves = int((paths[b, :, 0] >= 0).sum())
        row = [node for node in paths[b, int(torch.randint(0, leaves, (1,), generator=gen))]
               .tolist() if node >= 0]
        for j in range(int(torch.randint(0, len(row), (1,), generator=gen))):
            target[b, row[j]] = tokens[b, row[j + 1]]
    logits = torch.randn(batch, num_nodes, vocab, generator=gen)
    logits.scatter_(-1, target.unsqueeze(-1), logits.amax(-1, keepdim=True) + 1.0)
    return tokens, paths, logits


def test_host_greedy_accept_golden(ext):
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 5]], dtype=torch.int32)
    tokens = torch.tensor([[100, 5, 6, 7, 8, 9, 10]])
    _, _, paths = reference.build_tree(parents, 3)
    targets = torch.tensor([[6, 0, 9, 0, 0, 3, 0]])  # root -> node 2 -> node 5, node 6 rejected
    logits = torch.zeros(1, 7, 128).scatter_(-1, targets.unsqueeze(-1), 5.0)
    result = host_greedy_accept(ext, tokens, paths, logits)
    assert result.output_tokens.tolist() == [[6, 9, 3, -1]]
    assert result.num_accepted.tolist() == [2]
    assert result.accepted_nodes.tolist() == [[0, 2, 5, -1]]
    assert_same(result, reference.greedy_accept_tree(tokens, paths, logits), "(golden)")


@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 64, 65, 100])
def test_host_greedy_accept_planted(ext, gen, num_nodes):
    for shape in SHAPES:
        for batch in (1, 3, 1, 3):
            parents = random_parents(batch, num_nodes, gen, shape)
            deepest = int(ops.tree.tree_depth(parents).max())
            max_depth = deepest + int(torch.randint(0, 3, (1,), generator=gen))
            vocab = int(torch.randint(2, 9, (1,), generator=gen))
            tokens, paths, logits = planted_acceptance(parents, vocab, gen, max_depth)
            assert_same(host_greedy_accept(ext, tokens, paths, logits),
                        reference.greedy_accept_tree(tokens, paths, logits),
                        f"{shape} tree, vocab {vocab} {seed_note(gen)}\n{parents}")


@pytest.mark.parametrize("num_paths,width", [(1, 1), (5, 4), (40, 9)])
def test_host_greedy_accept_arbitrary_paths(ext, gen, num_paths, width):
    """Paths need not come from build_tree: any node sequences, padding rows anywhere."""
    batch, num_nodes, vocab = 4, 12, 3
    for _ in range(20):
        paths = torch.randint(0, num_nodes, (batch, num_paths, width), generator=gen)
        lengths = torch.randint(0, width + 1, (batch, num_paths), generator=gen)
        lengths[:, 0] = lengths[:, 0].clamp(min=1)  # the reference needs one real row
        paths[torch.arange(width) >= lengths.unsqueeze(-1)] = -1
        paths = paths.to(torch.int32)
        tokens = torch.randint(0, vocab, (batch, num_nodes), generator=gen)
        logits = torch.randint(0, 3, (batch, num_nodes, vocab), generator=gen).float()  # ties
        assert_same(host_greedy_accept(ext, tokens, paths, logits),
                    reference.greedy_accept_tree(tokens, paths, logits),
                    f"{seed_note(gen)}\npaths:\n{paths}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 7, 33, 1000])
def test_host_argmax_rows(ext, gen, dtype, vocab):
    rows = 50
    logits = torch.randint(-3, 3, (rows, vocab), generator=gen).to(dtype)  # many ties
    logits[torch.rand(rows, vocab, generator=gen) < 0.2] = float("-inf")
    logits[rows - 1] = float("-inf")
    logits[rows - 2, vocab // 2:] = float("nan")  # NaN is the max, first NaN wins
    out = torch.full((rows,), SENTINEL, dtype=torch.int64)
    ext.argmax_rows_host(logits.data_ptr(), out.data_ptr(), rows, vocab, DTYPE_CODES[dtype])
    expected = torch.argmax(logits, dim=-1)
    assert torch.equal(out, expected), f"{seed_note(gen)}\n{out}\n{expected}"


def test_host_greedy_accept_invalid_paths_stay_in_bounds(ext, gen):
    batch, num_nodes, num_paths, width = 3, 6, 4, 5
    tokens = torch.randint(0, 4, (batch, num_nodes), generator=gen)
    target_ids = torch.randint(0, 4, (batch, num_nodes), generator=gen)
    paths = torch.randint(-5, num_nodes + 5, (batch, num_paths, width), generator=gen,
                          dtype=torch.int32)
    paths[0] = -1  # every row padding: the "root only" fallback
    outputs = [guarded((batch, width), torch.int64), guarded((batch,), torch.int32),
               guarded((batch, width), torch.int32)]
    ext.greedy_accept_paths_host(tokens.data_ptr(), paths.data_ptr(), target_ids.data_ptr(),
                                 *(inner.data_ptr() for _, inner in outputs), batch, num_nodes,
                                 num_paths, width)
    for buffer, _ in outputs:
        assert_guards(buffer, f"{seed_note(gen)}\n{paths}")
    (_, output_tokens), (_, num_accepted), (_, accepted_nodes) = outputs
    assert num_accepted[0] == 0 and accepted_nodes[0].tolist() == [0] + [-1] * (width - 1)
    assert output_tokens[0].tolist() == [int(target_ids[0, 0])] + [-1] * (width - 1)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_nodes,vocab", [(1, 5), (33, 7), (64, 1000), (60, 32000),
                                             (8, 50257), (4, 151936)])
def test_gpu_greedy_accept_matches_torch(ext, gen, dtype, num_nodes, vocab):
    for shape in ("uniform", "deep", "bushy"):
        parents = random_parents(3, num_nodes, gen, shape)
        tokens, paths, logits = planted_acceptance(parents, min(vocab, 8), gen)
        logits = torch.cat([logits, torch.randn(*logits.shape[:2], vocab - logits.shape[2],
                                                generator=gen) - 10.0], dim=-1)
        tokens, paths, logits = tokens.cuda(), paths.cuda(), logits.to(dtype).cuda()
        assert_same(ops.greedy_accept_tree(tokens, paths, logits, backend="cuda"),
                    ops.greedy_accept_tree(tokens, paths, logits, backend="torch"),
                    f"{shape} tree, {dtype}, vocab {vocab} {seed_note(gen)}")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 7, 4097, 50257, 151936])
def test_gpu_argmax_rows_ties_and_alignment(ext, gen, dtype, vocab):
    rows = 37  # odd vocab sizes give rows at every alignment: the vectorised head and tail
    logits = torch.randint(-4, 4, (rows, vocab), generator=gen).to(dtype).cuda()
    out = torch.full((rows,), SENTINEL, dtype=torch.int64, device="cuda")
    ext.argmax_rows(logits.data_ptr(), out.data_ptr(), rows, vocab, DTYPE_CODES[dtype],
                    torch.cuda.current_stream().cuda_stream)
    assert torch.equal(out, torch.argmax(logits, dim=-1)), seed_note(gen)


@needs_gpu
def test_gpu_invalid_input_stays_in_bounds(ext, gen):
    batch, num_nodes, max_depth = 2, 70, 1
    parents = torch.randint(-3, num_nodes + 3, (batch, num_nodes), generator=gen,
                            dtype=torch.int32).cuda()
    outputs = [guarded((batch, num_nodes), torch.int32, "cuda"),
               guarded((batch, num_nodes, reference.mask_words(num_nodes)), torch.int32, "cuda"),
               guarded((batch, num_nodes, max_depth + 1), torch.int32, "cuda")]
    ext.build_tree(parents.data_ptr(), *(inner.data_ptr() for _, inner in outputs), batch,
                   num_nodes, max_depth, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    for buffer, _ in outputs:
        assert_guards(buffer.cpu(), seed_note(gen))


@needs_gpu
def test_gpu_greedy_accept_in_cuda_graph(ext, gen):
    """The runtime captures acceptance in a CUDA graph: capture, replay on new inputs."""
    parents = random_parents(2, 40, gen, "uniform")
    tokens, paths, logits = planted_acceptance(parents, 6, gen)
    tokens, paths, logits = tokens.cuda(), paths.cuda(), logits.cuda()
    ops.greedy_accept_tree(tokens, paths, logits, backend="cuda")  # warm up: load the kernels
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = ops.greedy_accept_tree(tokens, paths, logits, backend="cuda")
    for _ in range(3):
        new_tokens, new_paths, new_logits = planted_acceptance(parents, 6, gen)
        tokens.copy_(new_tokens)
        logits.copy_(new_logits)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(captured, ops.greedy_accept_tree(tokens, paths, logits, backend="torch"),
                    seed_note(gen))


def test_host_greedy_accept_chain_paths(ext, gen):
    """The CUDA chain backend is the tree kernels with one path 0..N-1 (reference.chain_paths)."""
    for num_nodes in (1, 2, 9, 40):
        tokens = torch.randint(0, 3, (4, num_nodes), generator=gen)
        logits = torch.randn(4, num_nodes, 3, generator=gen)
        paths = reference.chain_paths(4, num_nodes, tokens.device).contiguous()
        assert_same(host_greedy_accept(ext, tokens, paths, logits),
                    reference.greedy_accept_chain(tokens, logits), seed_note(gen))


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_greedy_accept_chain_matches_torch(ext, gen, dtype):
    for num_nodes, vocab in ((1, 5), (6, 32000), (64, 1000)):
        tokens = torch.randint(0, 4, (5, num_nodes), generator=gen).cuda()
        logits = torch.randn(5, num_nodes, vocab, generator=gen)
        logits[..., :4] += 3.0  # draft tokens often match the argmax
        logits = logits.to(dtype).cuda()
        assert_same(ops.greedy_accept_chain(tokens, logits, backend="cuda"),
                    ops.greedy_accept_chain(tokens, logits, backend="torch"),
                    f"{dtype}, vocab {vocab} {seed_note(gen)}")
