"""build_tree's CUDA kernel (csrc/tree.cu): host twin == reference, bounds, GPU == torch.

The ``*_host`` entry point runs the kernel's own per-node code on CPU pointers, which is how CI
(no GPU) proves it equal to the reference; the GPU tests run the real launcher through
``ops.build_tree(..., backend="cuda")`` when a GPU is present.
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference

from conftest import SHAPES, random_parents
from cuda_support import (SENTINEL, assert_guards, assert_same, guarded, needs_gpu, seed_note)


def host_build_tree(ext, parents: torch.Tensor, max_depth: int):
    batch, num_nodes = parents.shape
    depth = torch.full((batch, num_nodes), SENTINEL, dtype=torch.int32)
    mask = torch.full((batch, num_nodes, reference.mask_words(num_nodes)), SENTINEL,
                      dtype=torch.int32)
    paths = torch.full((batch, num_nodes, max_depth + 1), SENTINEL, dtype=torch.int32)
    ext.build_tree_host(parents.data_ptr(), depth.data_ptr(), mask.data_ptr(), paths.data_ptr(),
                        batch, num_nodes, max_depth)
    return depth, mask, paths


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
            parents = random_parents(batch, num_nodes, gen, shape)
            deepest = int(ops.tree.tree_depth(parents).max())
            extra = int(torch.randint(1, 4, (1,), generator=gen))
            for max_depth in (deepest, deepest + extra):
                assert_same(host_build_tree(ext, parents, max_depth),
                            reference.build_tree(parents, max_depth),
                            f"{shape} tree, max_depth {max_depth} {seed_note(gen)}\n{parents}")


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


@needs_gpu
@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 64, 65, 100, 300])
def test_gpu_build_tree_matches_torch(ext, gen, num_nodes):
    for shape in SHAPES:
        parents = random_parents(3, num_nodes, gen, shape).cuda()
        deepest = int(ops.tree.tree_depth(parents).max())
        for max_depth in (deepest, deepest + 3):
            assert_same(ops.build_tree(parents, max_depth, backend="cuda"),
                        ops.build_tree(parents, max_depth, backend="torch"),
                        f"{shape} tree {seed_note(gen)}")


@needs_gpu
def test_gpu_build_tree_large_matches_host(ext, gen):
    """N up to the kernel's limit, against the host twin (the reference is too slow there)."""
    for num_nodes, shape in ((1000, "uniform"), (4096, "deep"), (8192, "bushy")):
        parents = random_parents(2, num_nodes, gen, shape)
        max_depth = int(ops.tree.tree_depth(parents).max())
        expected = host_build_tree(ext, parents, max_depth)
        actual = ops.build_tree(parents.cuda(), max_depth, backend="cuda")
        assert_same([a.cpu() for a in actual], expected, f"{shape} N={num_nodes} {seed_note(gen)}")
