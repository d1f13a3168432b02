"""csrc/ CUDA kernels (eagle_kernels._C): the build, the kernel logic on the host, the GPU.

* The extension imports wherever it was built. Under ``CI=true`` with nvcc on PATH a missing
  extension fails the run (the build silently fell back to pure Python); elsewhere it skips.
* The ``*_host`` entry points run the kernels' own per-node / per-path code on CPU pointers:
  they must equal the reference ops exactly (golden trees, hundreds of random trees, planted
  acceptance) and never write outside their outputs, even on invalid input.
* On a GPU the real launchers (``backend="cuda"``) must equal ``backend="torch"``.

Random inputs come from the ``gen`` fixture (fresh seed per run); failure messages carry the
seed, and ``EAGLE_TEST_SEED=<base seed>`` replays a run.
"""

from __future__ import annotations

import importlib
import os
import shutil

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference

from conftest import BASE_SEED

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
SENTINEL = -7777  # prefilled into outputs: an entry the kernel forgot to write shows up
GUARD = 64  # sentinel entries before and after every output in the bounds tests


def _import_extension():
    try:
        return importlib.import_module("eagle_kernels._C"), None
    except Exception as error:  # a broken build can raise OSError as well as ImportError
        return None, error


def _missing_extension(error) -> None:
    nvcc = shutil.which("nvcc")
    message = f"eagle_kernels._C not importable ({error})"
    if os.environ.get("CI") == "true" and nvcc:
        pytest.fail(f"{message}, but CI=true and nvcc is on PATH ({nvcc}): the build must "
                    "produce the extension here")
    pytest.skip(f"{message}; nvcc on PATH: {nvcc or 'no'}")


@pytest.fixture(scope="module")
def ext():
    module, error = _import_extension()
    if module is None:
        _missing_extension(error)
    return module


def seed_note(gen: torch.Generator) -> str:
    return f"(test seed {gen.initial_seed()}; replay with EAGLE_TEST_SEED={BASE_SEED})"


def test_extension_imports():
    module, error = _import_extension()
    if module is None:
        _missing_extension(error)
    for name in ("build_tree", "build_tree_host", "argmax_rows", "argmax_rows_host",
                 "greedy_accept_paths", "greedy_accept_paths_host"):
        assert callable(getattr(module, name)), name


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

SHAPES = ("uniform", "deep", "bushy", "chain", "star")


def random_tree(batch: int, num_nodes: int, shape: str, gen: torch.Generator) -> torch.Tensor:
    """[B, N] int32 topologically ordered parents of one of several shapes."""
    parents = torch.full((batch, num_nodes), -1, dtype=torch.int32)
    for node in range(1, num_nodes):
        u = torch.rand(batch, generator=gen)
        if shape == "uniform":
            parent = (u * node).long()
        elif shape == "deep":  # one of the last three nodes: long paths (EAGLE chains)
            parent = node - 1 - (u * min(node, 3)).long()
        elif shape == "bushy":  # the first quarter: wide, shallow
            parent = (u * max(1, node // 4)).long()
        elif shape == "chain":
            parent = torch.full((batch,), node - 1)
        else:
            parent = torch.zeros(batch, dtype=torch.long)
        parents[:, node] = parent.to(torch.int32)
    return parents


def host_build_tree(ext, parents: torch.Tensor, max_depth: int):
    batch, num_nodes = parents.shape
    depth = torch.full((batch, num_nodes), SENTINEL, dtype=torch.int32)
    mask = torch.full((batch, num_nodes, reference.mask_words(num_nodes)), SENTINEL,
                      dtype=torch.int32)
    paths = torch.full((batch, num_nodes, max_depth + 1), SENTINEL, dtype=torch.int32)
    ext.build_tree_host(parents.data_ptr(), depth.data_ptr(), mask.data_ptr(), paths.data_ptr(),
                        batch, num_nodes, max_depth)
    return depth, mask, paths


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


def assert_same(actual, expected, note: str) -> None:
    for name, a, e in zip(("first", "second", "third"), actual, expected):
        assert a.dtype == e.dtype, f"{name} output dtype {a.dtype} != {e.dtype} {note}"
        assert torch.equal(a, e), f"{name} output differs {note}\nkernel:\n{a}\nreference:\n{e}"


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


# --------------------------------------------------------------------------------------------
# Host entry points == reference
# --------------------------------------------------------------------------------------------

GOLDEN_PARENTS = [
    [-1, 0, 0, 1, 1, 2, 5],  # the golden tree of test_tree.py
    [-1],
    [-1, 0, 0, 0, 0],
    list(range(-1, 39)),  # a chain across the 32-bit word boundary
]


@pytest.mark.parametrize("rows", GOLDEN_PARENTS, ids=["golden", "single", "star", "chain40"])
def test_host_build_tree_golden(ext, rows):
    parents = torch.tensor([rows], dtype=torch.int32)
    max_depth = int(reference.build_tree(parents)[0].max())
    for depth_limit in (max_depth, max_depth + 2):
        assert_same(host_build_tree(ext, parents, depth_limit),
                    reference.build_tree(parents, depth_limit), f"(parents {rows})")


@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 64, 65, 100])
@pytest.mark.parametrize("batch", [1, 3])
def test_host_build_tree_random(ext, gen, batch, num_nodes):
    for shape in SHAPES:
        for _ in range(3):
            parents = random_tree(batch, num_nodes, shape, gen)
            deepest = int(ops.tree.tree_depth(parents).max())
            extra = int(torch.randint(1, 4, (1,), generator=gen))
            for max_depth in (deepest, deepest + extra):
                assert_same(host_build_tree(ext, parents, max_depth),
                            reference.build_tree(parents, max_depth),
                            f"{shape} tree, max_depth {max_depth} {seed_note(gen)}\n{parents}")


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
            parents = random_tree(batch, num_nodes, shape, gen)
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


# --------------------------------------------------------------------------------------------
# Invalid input stays in bounds
# --------------------------------------------------------------------------------------------


def guarded(shape, dtype, device="cpu"):
    """A sentinel-filled buffer with GUARD spare entries each side, and its inner view."""
    numel = 1
    for size in shape:
        numel *= size
    buffer = torch.full((numel + 2 * GUARD,), SENTINEL, dtype=dtype, device=device)
    return buffer, buffer[GUARD:GUARD + numel].view(shape)


def assert_guards(buffer, note):
    assert bool((buffer[:GUARD] == SENTINEL).all() and (buffer[-GUARD:] == SENTINEL).all()), \
        f"write outside the output {note}"


def test_host_build_tree_invalid_parents_stay_in_bounds(ext, gen):
    for num_nodes in (1, 5, 33, 70):
        batch, max_depth = 2, int(torch.randint(0, 3, (1,), generator=gen))
        parents = torch.randint(-3, num_nodes + 3, (batch, num_nodes), generator=gen,
                                dtype=torch.int32)
        outputs = [guarded((batch, num_nodes), torch.int32),
                   guarded((batch, num_nodes, reference.mask_words(num_nodes)), torch.int32),
                   guarded((batch, num_nodes, max_depth + 1), torch.int32)]
        ext.build_tree_host(parents.data_ptr(), *(inner.data_ptr() for _, inner in outputs),
                            batch, num_nodes, max_depth)
        for buffer, _ in outputs:
            assert_guards(buffer, f"{seed_note(gen)}\n{parents}")


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


def test_bad_sizes_raise_value_error(ext):
    with pytest.raises(ValueError, match="num_nodes"):
        ext.build_tree_host(0, 0, 0, 0, 1, 0, 0)
    with pytest.raises(ValueError, match="dtype_code"):
        ext.argmax_rows_host(0, 0, 1, 4, 7)
    with pytest.raises(ValueError, match="width"):
        ext.greedy_accept_paths_host(0, 0, 0, 0, 0, 0, 1, 4, 1, 0)


# --------------------------------------------------------------------------------------------
# GPU: the real launchers through the public ops
# --------------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_gpu
@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 64, 65, 100, 300])
def test_gpu_build_tree_matches_torch(ext, gen, num_nodes):
    for shape in SHAPES:
        parents = random_tree(3, num_nodes, shape, gen).cuda()
        deepest = int(ops.tree.tree_depth(parents).max())
        for max_depth in (deepest, deepest + 3):
            assert_same(ops.build_tree(parents, max_depth, backend="cuda"),
                        ops.build_tree(parents, max_depth, backend="torch"),
                        f"{shape} tree {seed_note(gen)}")


@needs_gpu
def test_gpu_build_tree_large_matches_host(ext, gen):
    """N up to the kernel's limit, against the host twin (the reference is too slow there)."""
    for num_nodes, shape in ((1000, "uniform"), (4096, "deep"), (8192, "bushy")):
        parents = random_tree(2, num_nodes, shape, gen)
        max_depth = int(ops.tree.tree_depth(parents).max())
        expected = host_build_tree(ext, parents, max_depth)
        actual = ops.build_tree(parents.cuda(), max_depth, backend="cuda")
        assert_same([a.cpu() for a in actual], expected, f"{shape} N={num_nodes} {seed_note(gen)}")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_nodes,vocab", [(1, 5), (33, 7), (64, 1000), (60, 32000),
                                             (8, 50257), (4, 151936)])
def test_gpu_greedy_accept_matches_torch(ext, gen, dtype, num_nodes, vocab):
    for shape in ("uniform", "deep", "bushy"):
        parents = random_tree(3, num_nodes, shape, gen)
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
    parents = random_tree(2, 40, "uniform", gen)
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
