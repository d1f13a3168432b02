"""build_tree and the packed ancestor mask: golden trees, random trees, bad inputs."""

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference

from conftest import chain_parents, random_parents


def as_parents(*rows):
    return torch.tensor(rows, dtype=torch.int32)


def test_golden_tree():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #              \
    #               6
    depth, mask, paths = ops.build_tree(as_parents([-1, 0, 0, 1, 1, 2, 5]), max_depth=3)
    assert depth.tolist() == [[0, 1, 1, 2, 2, 2, 3]]
    assert mask.tolist() == [[[0b1], [0b11], [0b101], [0b1011], [0b10011], [0b100101],
                              [0b1100101]]]
    assert paths.tolist() == [[[0, 1, 3, -1], [0, 1, 4, -1], [0, 2, 5, 6]] + [[-1] * 4] * 4]
    assert depth.dtype == mask.dtype == paths.dtype == torch.int32


def test_golden_single_node_and_star():
    depth, mask, paths = ops.build_tree(as_parents([-1]), max_depth=0)
    assert (depth.tolist(), mask.tolist(), paths.tolist()) == ([[0]], [[[1]]], [[[0]]])
    depth, mask, paths = ops.build_tree(as_parents([-1, 0, 0, 0, 0]), max_depth=1)
    assert depth.tolist() == [[0, 1, 1, 1, 1]]
    assert mask.tolist() == [[[1], [3], [5], [9], [17]]]
    assert paths.tolist() == [[[0, 1], [0, 2], [0, 3], [0, 4], [-1, -1]]]


def test_golden_chain_crosses_word_boundary():
    depth, mask, paths = ops.build_tree(chain_parents(1, 40))
    assert depth.tolist() == [list(range(40))]
    assert mask[0, 31].tolist() == [-1, 0]  # bits 0..31 set: bit 31 makes the word negative
    assert mask[0, 35].tolist() == [-1, 0b1111]
    assert paths.shape == (1, 40, 40)
    assert paths[0, 0].tolist() == list(range(40)) and bool((paths[0, 1:] == -1).all())


def walk_ancestors(parents_row, node):
    chain = [node]
    while parents_row[chain[-1]] >= 0:
        chain.append(parents_row[chain[-1]])
    return chain[::-1]


@pytest.mark.parametrize("batch,num_nodes", [(1, 1), (3, 2), (2, 31), (3, 33), (1, 64), (2, 65),
                                             (1, 100)])
def test_random_trees_match_walked_ancestors(gen, batch, num_nodes):
    parents = random_parents(batch, num_nodes, gen)
    depth, mask, paths = ops.build_tree(parents)
    dense = ops.unpack_tree_mask(mask, num_nodes)
    for b in range(batch):
        rows = parents[b].tolist()
        has_child = {p for p in rows[1:]}
        leaves = [i for i in range(num_nodes) if i not in has_child]
        for node in range(num_nodes):
            chain = walk_ancestors(rows, node)
            assert depth[b, node] == len(chain) - 1
            assert torch.nonzero(dense[b, node]).flatten().tolist() == sorted(chain)
        for row, leaf in enumerate(leaves):
            chain = walk_ancestors(rows, leaf)
            assert paths[b, row].tolist() == chain + [-1] * (num_nodes - len(chain))
        assert bool((paths[b, len(leaves):] == -1).all())


def test_pack_unpack_round_trip(gen):
    dense = torch.rand(3, 5, 70, generator=gen) < 0.5
    packed = ops.pack_tree_mask(dense)
    assert packed.shape == (3, 5, 3) and packed.dtype == torch.int32
    assert torch.equal(ops.unpack_tree_mask(packed, 70), dense)


def test_bad_inputs():
    with pytest.raises(ValueError, match="parents: expected dtype int32"):
        ops.build_tree(torch.tensor([[-1, 0]]))
    with pytest.raises(TypeError, match="parents: expected a torch.Tensor"):
        ops.build_tree([[-1, 0]])
    with pytest.raises(ValueError, match=r"parents: expected shape \[\*, \*\]"):
        ops.build_tree(as_parents(-1, 0))
    with pytest.raises(ValueError, match="parents: expected a contiguous"):
        ops.build_tree(as_parents([-1, 0, 0], [-1, 0, 1]).t().contiguous().t())
    with pytest.raises(ValueError, match=r"parents\[:, 0\] == -1"):
        ops.build_tree(as_parents([0, 0, 1]))
    with pytest.raises(ValueError, match="topologically ordered"):
        ops.build_tree(as_parents([-1, 2, 0]))
    with pytest.raises(ValueError, match="topologically ordered"):
        ops.build_tree(as_parents([-1, 0, -1]))
    with pytest.raises(ValueError, match="max_depth: expected >= the tree depth 2"):
        ops.build_tree(as_parents([-1, 0, 1]), max_depth=1)
    with pytest.raises(ValueError, match="backend"):
        ops.build_tree(as_parents([-1, 0]), backend="gpu")


def test_reference_rejects_too_small_max_depth_itself():
    with pytest.raises(ValueError, match="max_depth"):
        reference.build_tree(as_parents([-1, 0, 1]), max_depth=1)
