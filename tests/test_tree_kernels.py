"""eagle2_rerank (Triton, CUDA, cpu) and build_tree (Triton, cpu) kernels against the reference.

CPU routes: ``backend="triton"`` under the interpreter, ``eagle2_rerank_host`` (the CUDA
kernel's per-candidate and per-node code on CPU pointers) and ``backend="cpu"`` (csrc/cpu/tree.h)
in every instruction set the processor has. Trees are compared exactly (every
DraftTree field and ``selected``). Score ties are everywhere on purpose (scores on a 0.25 grid):
the lowest candidate index must win, which also keeps every kept node's parent kept. GPU tests
compare ``backend="cuda"`` / ``"triton"`` with ``"torch"`` when a GPU is present.
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference

from conftest import SHAPES, random_parents
from cpu_support import CPU_ISAS, cpu_backend_missing_reason, using_cpu_isa
from cuda_support import (SENTINEL, assert_guards, assert_same, gpu_when_present, guarded,
                          needs_gpu, seed_note)
from test_topk import golden_candidates


def host_rerank(ext, roots, tokens, scores, parents, num_nodes, max_depth=None):
    batch, candidates = tokens.shape
    max_depth = num_nodes - 1 if max_depth is None else max_depth
    words = reference.mask_words(num_nodes)
    tree = reference.DraftTree(
        torch.full((batch, num_nodes), SENTINEL, dtype=torch.int64),
        *(torch.full(shape, SENTINEL, dtype=torch.int32)
          for shape in ((batch, num_nodes), (batch, num_nodes))),
        torch.full((batch, num_nodes), float(SENTINEL)),
        torch.full((batch, num_nodes, words), SENTINEL, dtype=torch.int32),
        torch.full((batch, num_nodes, max_depth + 1), SENTINEL, dtype=torch.int32))
    selected = torch.full((batch, num_nodes - 1), SENTINEL, dtype=torch.int64)
    ext.eagle2_rerank_host(roots.data_ptr(), tokens.data_ptr(), scores.data_ptr(),
                           parents.data_ptr(), *(t.data_ptr() for t in tree), selected.data_ptr(),
                           batch, candidates, num_nodes, max_depth)
    return tree, selected


@pytest.fixture(params=["triton", "cuda_host", *(f"cpu-{isa}" for isa in CPU_ISAS)])
def rerank(request):
    """eagle2_rerank of one kernel route that runs on CPU (the cpu backend in each instruction
    set the processor has)."""
    if request.param.startswith("cpu-"):
        with using_cpu_isa(request.param.removeprefix("cpu-")):
            yield lambda *a: ops.eagle2_rerank(*a, backend="cpu")
        return
    if request.param == "triton":
        yield lambda *a: ops.eagle2_rerank(*a, backend="triton")
        return
    ext = request.getfixturevalue("ext")
    yield lambda *a: host_rerank(ext, *a)


def random_candidates(batch, candidates, gen, root_children=None, step=0.25):
    """[B, M] candidates in drafting order: parents before children, scores on a coarse grid
    (ties everywhere) and never increasing from parent to child (equal is allowed)."""
    root_children = root_children or max(1, candidates // 8)
    parents = torch.full((batch, candidates), -1, dtype=torch.int32)
    scores = torch.zeros(batch, candidates)
    drop = (torch.rand(batch, candidates, generator=gen) * 4 / step).floor() * step
    for i in range(candidates):
        if i >= root_children:
            parents[:, i] = (torch.rand(batch, generator=gen) * i).long().to(torch.int32)
        parent_score = torch.where(parents[:, i] >= 0,
                                   scores.gather(1, parents[:, i:i + 1].long().clamp(min=0))[:, 0],
                                   torch.zeros(batch))
        scores[:, i] = parent_score - drop[:, i]
    tokens = torch.randint(0, 1 << 40, (batch, candidates), generator=gen)
    roots = torch.randint(0, 1 << 40, (batch,), generator=gen)
    return roots, tokens, scores, parents


def assert_rerank_matches(actual, roots, tokens, scores, parents, num_nodes, max_depth, note):
    expected = reference.eagle2_rerank(roots, tokens, scores, parents, num_nodes, max_depth)
    names = reference.DraftTree._fields + ("selected",)
    for name, a, e in zip(names, tuple(actual[0]) + (actual[1],),
                          tuple(expected[0]) + (expected[1],)):
        assert a.dtype == e.dtype and torch.equal(a.cpu(), e), \
            f"{name} differs {note}\nkernel:\n{a}\nreference:\n{e}"


def test_rerank_golden(rerank):
    tokens, scores, parents = golden_candidates()
    tree, selected = rerank(torch.tensor([100]), tokens, scores, parents, 6, 3)
    assert selected.tolist() == [[0, 1, 2, 4, 6]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2, 3]]
    assert tree.paths.tolist() == [[[0, 2, 4, -1], [0, 1, 3, 5]] + [[-1] * 4] * 4]
    assert tree.tree_mask.tolist() == [[[1], [3], [5], [11], [21], [43]]]
    assert_rerank_matches((tree, selected), torch.tensor([100]), tokens, scores, parents, 6, 3,
                          "golden")


def test_rerank_tie_prefers_parent_and_single_node(rerank):
    args = (torch.tensor([7]), torch.tensor([[1, 2, 3]]), torch.tensor([[-0.5, -0.5, -0.9]]),
            torch.tensor([[-1, 0, -1]], dtype=torch.int32))
    for num_nodes in (1, 2, 3, 4):
        assert_rerank_matches(rerank(*args, num_nodes, None), *args, num_nodes, None,
                              f"N={num_nodes}")


@gpu_when_present
@pytest.mark.parametrize("backend", ["triton", "cpu", "auto"])
def test_rerank_without_candidates_is_the_root_alone(backend):
    """M = 0 candidates, N = 1: the root alone (the Triton launcher sized its tiles by M and
    divided by zero; the cuda backend refuses M = 0, so auto answers it elsewhere)."""
    from eagle_kernels.ops._backend import backend_status

    if backend != "auto" and not backend_status(backend).available:
        pytest.skip(f"{backend}: {backend_status(backend).reason}")
    device = "cuda" if backend in ("triton", "auto") and torch.cuda.is_available() else "cpu"
    args = (torch.tensor([7, 8]), torch.zeros(2, 0, dtype=torch.int64), torch.zeros(2, 0),
            torch.zeros(2, 0, dtype=torch.int32))
    got = ops.eagle2_rerank(*(a.to(device) for a in args), 1, None, backend=backend)
    assert_rerank_matches(got, *args, 1, None, "M=0")


@pytest.mark.parametrize("batch,candidates,num_nodes", [(1, 3, 4), (5, 40, 20), (64, 50, 33),
                                                        (5, 610, 60), (1, 710, 60)])
def test_rerank_random(rerank, gen, batch, candidates, num_nodes):
    roots, tokens, scores, parents = random_candidates(batch, candidates, gen)
    max_depth = int(ops.tree.tree_depth(torch.cat(
        [torch.full((batch, 1), -1, dtype=torch.int32), parents + 1], 1)).max())
    assert_rerank_matches(rerank(roots, tokens, scores, parents, num_nodes, max_depth), roots,
                          tokens, scores, parents, num_nodes, max_depth,
                          f"B={batch} M={candidates} N={num_nodes} {seed_note(gen)}")


@pytest.fixture(params=["triton", "cuda_host", *(f"cpu-{isa}" for isa in CPU_ISAS)])
def rerank_and_count(request):
    """(eagle2_rerank route, how many random trees it can check here in a few seconds)."""
    if request.param.startswith("cpu-"):
        with using_cpu_isa(request.param.removeprefix("cpu-")):  # 1500 x 24: the parallel path
            yield lambda *a: ops.eagle2_rerank(*a, backend="cpu"), 1500
        return
    if request.param == "triton":  # the interpreter runs ~100 ms per tree
        yield lambda *a: ops.eagle2_rerank(*a, backend="triton"), 120
        return
    ext = request.getfixturevalue("ext")
    yield lambda *a: host_rerank(ext, *a), 1000


def test_rerank_many_trees(rerank_and_count, gen):
    """1000 candidate sets on the host twin, 120 in the interpreter (EAGLE-2 style: 4 root
    children, 24 candidates), 12-node trees."""
    rerank, count = rerank_and_count
    roots, tokens, scores, parents = random_candidates(count, 24, gen, root_children=4)
    assert_rerank_matches(rerank(roots, tokens, scores, parents, 12, None), roots, tokens,
                          scores, parents, 12, None, seed_note(gen))


def test_rerank_eagle2_draft(rerank, gen):
    """Candidates from a real drafting loop (top_k 10, depth 6 -> M = 610), N = 60."""
    from test_topk import draft_candidates

    tokens, scores, parents = draft_candidates(2, 500, 10, 6, gen)
    roots = torch.randint(0, 500, (2,), generator=gen)
    assert_rerank_matches(rerank(roots, tokens, scores, parents, 60, 7), roots, tokens, scores,
                          parents, 60, 7, seed_note(gen))


@pytest.mark.parametrize("backend", ["triton", "torch", "cpu"])
def test_rerank_op_raises_like_the_reference(backend):
    if backend == "cpu" and cpu_backend_missing_reason() is not None:
        pytest.skip(f"cpu backend: {cpu_backend_missing_reason()}")
    args = (torch.tensor([7]), torch.tensor([[1, 2]]), torch.tensor([[-2.0, -1.0]]),
            torch.tensor([[-1, 0]], dtype=torch.int32))
    with pytest.raises(ValueError, match="candidate_scores: a kept candidate's parent"):
        ops.eagle2_rerank(*args, 2, backend=backend)
    tokens, scores, parents = golden_candidates()
    with pytest.raises(ValueError, match="max_depth"):
        ops.eagle2_rerank(torch.tensor([1]), tokens, scores, parents, 6, max_depth=2,
                          backend=backend)


GARBAGE_SIZES = ((1, 2), (5, 3), (40, 41), (70, 33))  # (candidates, num_nodes)


def garbage_rerank_case(gen, candidates, num_nodes):
    """Garbage rerank input (parents out of order or out of range, NaN / inf scores, a random
    max_depth) and guarded outputs: (inputs, outputs, sizes); ``outputs`` are (buffer, inner)
    pairs in the order tokens, parents, depth, scores, tree_mask, paths, selected."""
    batch, max_depth = 2, int(torch.randint(0, 3, (1,), generator=gen))
    parents = torch.randint(-3, candidates + 3, (batch, candidates), generator=gen,
                            dtype=torch.int32)
    scores = torch.randn(batch, candidates, generator=gen)
    scores[0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])[:candidates]
    tokens = torch.randint(0, 100, (batch, candidates), generator=gen)
    roots = torch.randint(0, 100, (batch,), generator=gen)
    words = reference.mask_words(num_nodes)
    shapes = [((batch, num_nodes), torch.int64), ((batch, num_nodes), torch.int32),
              ((batch, num_nodes), torch.int32), ((batch, num_nodes), torch.float32),
              ((batch, num_nodes, words), torch.int32),
              ((batch, num_nodes, max_depth + 1), torch.int32),
              ((batch, num_nodes - 1), torch.int64)]
    outputs = [guarded(shape, dtype) for shape, dtype in shapes]
    return (roots, tokens, scores, parents), outputs, (batch, candidates, num_nodes, max_depth)


def test_host_rerank_invalid_input_stays_in_bounds(ext, gen):
    """Garbage parents and scores (increasing, NaN, +-inf): every write stays in its output."""
    for candidates, num_nodes in GARBAGE_SIZES:
        inputs, outputs, sizes = garbage_rerank_case(gen, candidates, num_nodes)
        ext.eagle2_rerank_host(*(t.data_ptr() for t in inputs),
                               *(inner.data_ptr() for _, inner in outputs), *sizes)
        for buffer, _ in outputs:
            assert_guards(buffer, f"{seed_note(gen)}\n{inputs[3]}")


@pytest.mark.parametrize("isa", CPU_ISAS)
def test_cpu_rerank_and_build_tree_invalid_input_stay_in_bounds(gen, isa):
    """The cpu kernels on the same garbage (build_tree on garbage parents, trees deeper than
    max_depth), value checks bypassed: every write stays in its output."""
    with using_cpu_isa(isa):
        from eagle_kernels import _cpu

        for candidates, num_nodes in GARBAGE_SIZES:
            inputs, outputs, sizes = garbage_rerank_case(gen, candidates, num_nodes)
            _cpu.eagle2_rerank(*(t.data_ptr() for t in inputs),
                               [inner.data_ptr() for _, inner in outputs], *sizes)
            batch, _, _, max_depth = sizes
            built = [guarded(inner.shape, torch.int32) for _, inner in
                     (outputs[2], outputs[4], outputs[5])]  # depth, tree_mask, paths
            bad_parents = torch.randint(-3, num_nodes + 3, (batch, num_nodes), generator=gen,
                                        dtype=torch.int32)
            _cpu.build_tree(bad_parents.data_ptr(), *(inner.data_ptr() for _, inner in built),
                            batch, num_nodes, max_depth)
            for buffer, _ in outputs + built:
                assert_guards(buffer, f"{isa} {seed_note(gen)}\n{inputs[3]}\n{bad_parents}")


@pytest.mark.parametrize("isa", CPU_ISAS)
@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 60, 65, 100, 700])
def test_cpu_build_tree_random(gen, isa, num_nodes):
    with using_cpu_isa(isa):
        for shape in SHAPES:
            parents = random_parents(3, num_nodes, gen, shape)
            deepest = int(ops.tree.tree_depth(parents).max())
            for max_depth in (deepest, deepest + 3):
                assert_same(ops.build_tree(parents, max_depth, backend="cpu"),
                            reference.build_tree(parents, max_depth),
                            f"{isa} {shape} tree, max_depth {max_depth} {seed_note(gen)}")


# --------------------------------------------------------------------------------------------
# build_tree (Triton)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [[-1, 0, 0, 1, 1, 2, 5], [-1], [-1, 0, 0, 0, 0],
                                  list(range(-1, 39))], ids=["golden", "single", "star", "chain40"])
def test_triton_build_tree_golden(rows):
    parents = torch.tensor([rows], dtype=torch.int32)
    deepest = int(reference.build_tree(parents)[0].max())
    for max_depth in (deepest, deepest + 2):
        assert_same(ops.build_tree(parents, max_depth, backend="triton"),
                    reference.build_tree(parents, max_depth), f"(parents {rows})")


@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 60, 65, 100])
def test_triton_build_tree_random(gen, num_nodes):
    for shape in SHAPES:
        parents = random_parents(2, num_nodes, gen, shape)
        deepest = int(ops.tree.tree_depth(parents).max())
        for max_depth in (deepest, deepest + 3)[:2 if num_nodes <= 33 else 1]:
            assert_same(ops.build_tree(parents, max_depth, backend="triton"),
                        reference.build_tree(parents, max_depth),
                        f"{shape} tree, max_depth {max_depth} {seed_note(gen)}\n{parents}")


def test_triton_build_tree_limits():
    with pytest.raises(ValueError, match="at most 1024 nodes"):
        ops.build_tree(torch.arange(-1, 1100, dtype=torch.int32)[None], backend="triton")


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("batch", [1, 5, 64, 1000])
def test_gpu_rerank_matches_torch(ext, gen, backend, batch):
    for candidates, num_nodes in ((24, 12), (610, 60), (710, 60), (2048, 1024)):
        trees = batch if num_nodes <= 60 else min(batch, 2)  # the reference is O(B * N^2)
        roots, tokens, scores, parents = random_candidates(trees, candidates, gen)
        args = [t.cuda() for t in (roots, tokens, scores, parents)]
        actual = ops.eagle2_rerank(*args, num_nodes, backend=backend)
        assert_rerank_matches(actual, roots, tokens, scores, parents, num_nodes, None,
                              f"{backend} M={candidates} {seed_note(gen)}")


@needs_gpu
@pytest.mark.parametrize("backend", ["triton"])  # the verdict credits the backend a GPU case names
@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 64, 65, 100, 300, 1024])
def test_gpu_triton_build_tree_matches_torch(gen, num_nodes, backend):
    for shape in SHAPES:
        parents = random_parents(3, num_nodes, gen, shape).cuda()
        deepest = int(ops.tree.tree_depth(parents).max())
        assert_same(ops.build_tree(parents, deepest, backend=backend),
                    ops.build_tree(parents, deepest, backend="torch"), f"{shape} {seed_note(gen)}")
