"""topk_log_softmax, eagle2_expand, eagle2_rerank: goldens, ties, random drafting, bad input."""

import math

import pytest
import torch

from eagle_kernels import ops


def test_topk_log_softmax_golden_with_ties_and_d2t():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0]])
    values, ids = ops.topk_log_softmax(logits, 3)
    log_z = math.log(math.exp(1) + 2 * math.exp(3) + math.exp(2))
    assert ids.tolist() == [[1, 2, 3]]  # the tie 3.0 / 3.0 goes to the lower id first
    torch.testing.assert_close(values, torch.tensor([[3 - log_z, 3 - log_z, 2 - log_z]]))
    _, mapped = ops.topk_log_softmax(logits, 3, d2t=torch.tensor([0, 5, 5, 10]))
    assert mapped.tolist() == [[6, 7, 13]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_topk_log_softmax_dtypes_and_masked_vocab(gen, dtype):
    logits = torch.randn(5, 111, generator=gen).to(dtype)
    logits[:, 50:] = float("-inf")
    values, ids = ops.topk_log_softmax(logits, 7, backend="torch")  # the definition, exactly
    assert values.dtype == torch.float32 and ids.dtype == torch.int64
    expected = torch.log_softmax(logits.float(), -1).gather(1, ids)
    assert torch.equal(values, expected)
    assert bool((ids < 50).all()) and bool((values[:, :-1] >= values[:, 1:]).all())


def test_eagle2_expand_golden_and_ties():
    scores, index, best = ops.eagle2_expand(torch.tensor([[-1.0, -2.0]]),
                                            torch.tensor([[[-0.1, -0.5], [-0.2, -0.3]]]), 3)
    torch.testing.assert_close(scores, torch.tensor([[-1.1, -1.5, -2.2, -2.3]]))
    assert index.tolist() == [[0, 1, 2]]
    torch.testing.assert_close(best, torch.tensor([[-1.1, -1.5, -2.2]]))
    _, index, _ = ops.eagle2_expand(torch.zeros(1, 2), torch.tensor([[[-1.0, -2.0]] * 2]), 3)
    assert index.tolist() == [[0, 2, 1]]


def golden_candidates():
    """A hand-worked EAGLE-2 draft (top_k 2, two expansion steps) of 10 candidates."""
    tokens = torch.tensor([[10, 11, 20, 21, 22, 23, 30, 31, 32, 33]])
    scores = torch.tensor([[-0.1, -0.5, -0.3, -1.1, -0.6, -2.5, -0.35, -1.2, -0.61, -3.6]])
    parents = torch.tensor([[-1, -1, 0, 0, 1, 1, 2, 2, 4, 4]], dtype=torch.int32)
    return tokens, scores, parents


def test_eagle2_rerank_golden():
    tokens, scores, parents = golden_candidates()
    tree, selected = ops.eagle2_rerank(torch.tensor([100]), tokens, scores, parents, 6,
                                       max_depth=3)
    assert selected.tolist() == [[0, 1, 2, 4, 6]]
    assert tree.tokens.tolist() == [[100, 10, 11, 20, 22, 30]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2, 3]]
    assert tree.depth.tolist() == [[0, 1, 1, 2, 2, 3]]
    # gathered, not computed: the candidates' own scores bit for bit (the root's is 0)
    assert torch.equal(tree.scores, torch.tensor([[0.0, -0.1, -0.5, -0.3, -0.6, -0.35]]))
    assert tree.paths.tolist() == [[[0, 2, 4, -1], [0, 1, 3, 5]] + [[-1] * 4] * 4]
    assert tree.tree_mask.tolist() == [[[1], [3], [5], [11], [21], [43]]]


def test_eagle2_rerank_tie_prefers_parent():
    # Candidate 1 is a child of candidate 0 with log-probability 0: equal scores. With room
    # for one candidate, the parent (lower index) must win, keeping the tree closed.
    tree, selected = ops.eagle2_rerank(torch.tensor([7]), torch.tensor([[1, 2, 3]]),
                                       torch.tensor([[-0.5, -0.5, -0.9]]),
                                       torch.tensor([[-1, 0, -1]], dtype=torch.int32), 2)
    assert selected.tolist() == [[0]] and tree.tokens.tolist() == [[7, 1]]


def test_eagle2_rerank_rejects_scores_increasing_along_a_path():
    with pytest.raises(ValueError, match="candidate_scores: a kept candidate's parent"):
        ops.eagle2_rerank(torch.tensor([7]), torch.tensor([[1, 2]]), torch.tensor([[-2.0, -1.0]]),
                          torch.tensor([[-1, 0]], dtype=torch.int32), 2)


def draft_candidates(batch, vocab, top_k, depth, gen):
    """Simulate EAGLE-2 drafting with random logits through the public ops."""
    values, ids = ops.topk_log_softmax(torch.randn(batch, vocab, generator=gen) * 3, top_k)
    tokens, scores = [ids], [values]
    parents = [torch.full((batch, top_k), -1, dtype=torch.int64)]
    frontier_scores, frontier_ids = values, torch.arange(top_k).expand(batch, -1)
    offset = top_k
    for _ in range(depth):
        logits = torch.randn(batch * top_k, vocab, generator=gen) * 3
        child_values, child_ids = ops.topk_log_softmax(logits, top_k)
        step_scores, next_index, next_scores = ops.eagle2_expand(
            frontier_scores, child_values.view(batch, top_k, top_k), top_k)
        tokens.append(child_ids.view(batch, -1))
        scores.append(step_scores)
        parents.append(frontier_ids.repeat_interleave(top_k, dim=1))
        frontier_ids = offset + next_index
        frontier_scores = next_scores
        offset += top_k * top_k
    return (torch.cat(tokens, 1), torch.cat(scores, 1),
            torch.cat(parents, 1).to(torch.int32))


@pytest.mark.parametrize("batch,vocab,top_k,depth,num_nodes",
                         [(64, 111, 4, 3, 20), (40, 50, 3, 5, 16), (5, 32000, 10, 2, 60)])
def test_eagle2_rerank_random_drafts(gen, batch, vocab, top_k, depth, num_nodes):
    tokens, scores, parents = draft_candidates(batch, vocab, top_k, depth, gen)
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    tree, selected = ops.eagle2_rerank(roots, tokens, scores, parents, num_nodes,
                                       max_depth=depth + 1)
    best = torch.sort(scores, dim=1, descending=True).values[:, : num_nodes - 1]
    assert torch.equal(torch.sort(tree.scores[:, 1:], 1, descending=True).values, best)
    assert torch.equal(tree.tokens[:, 1:], tokens.gather(1, selected))
    assert torch.equal(tree.tokens[:, 0], roots)
    for b in range(batch):  # tree parents point at the nodes holding the candidate parents
        for node in range(1, num_nodes):
            candidate_parent = int(parents[b, selected[b, node - 1]])
            parent_node = int(tree.parents[b, node])
            assert (candidate_parent == -1 and parent_node == 0) or \
                int(selected[b, parent_node - 1]) == candidate_parent
    depth_again, mask_again, paths_again = ops.build_tree(tree.parents, depth + 1)
    assert torch.equal(depth_again, tree.depth) and torch.equal(mask_again, tree.tree_mask)
    assert torch.equal(paths_again, tree.paths)


def test_bad_inputs():
    with pytest.raises(ValueError, match="k: expected an int in"):
        ops.topk_log_softmax(torch.randn(2, 5), 6)
    with pytest.raises(TypeError, match="k: expected an int"):
        ops.topk_log_softmax(torch.randn(2, 5), 2.0)
    with pytest.raises(ValueError, match="logits: expected finite"):
        ops.topk_log_softmax(torch.tensor([[0.0, float("nan")]]), 1)
    with pytest.raises(ValueError, match="logits: every row needs"):
        ops.topk_log_softmax(torch.full((1, 3), float("-inf")), 1)
    with pytest.raises(ValueError, match=r"d2t: expected shape \[5\]"):
        ops.topk_log_softmax(torch.randn(2, 5), 2, d2t=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="child_log_probs: expected shape"):
        ops.eagle2_expand(torch.zeros(2, 3), torch.zeros(2, 2, 3), 1)
    with pytest.raises(ValueError, match="top_k: expected an int in"):
        ops.eagle2_expand(torch.zeros(2, 3), torch.zeros(2, 3, 2), 7)
    for frontier, children, name in (
            (torch.tensor([[float("inf"), -1.0]]), torch.zeros(1, 2, 2), "frontier_scores"),
            (torch.zeros(1, 2), torch.tensor([[[0.0, float("nan")]] * 2]), "child_log_probs")):
        with pytest.raises(ValueError, match=f"{name}: expected log-probabilities"):
            ops.eagle2_expand(frontier, children, 1)  # +inf + -inf would be a NaN score
    # an empty dimension is the tensor's fault, not k's / top_k's
    with pytest.raises(ValueError, match="logits: expected a vocabulary of at least one"):
        ops.topk_log_softmax(torch.randn(2, 0), 1)
    with pytest.raises(ValueError, match="frontier_scores: expected at least one frontier node"):
        ops.eagle2_expand(torch.zeros(2, 0), torch.zeros(2, 0, 3), 1)
    with pytest.raises(ValueError, match="child_log_probs: expected at least one child"):
        ops.eagle2_expand(torch.zeros(2, 3), torch.zeros(2, 3, 0), 1)
    tokens, scores, parents = golden_candidates()
    with pytest.raises(ValueError, match="num_nodes: expected an int in"):
        ops.eagle2_rerank(torch.tensor([1]), tokens, scores, parents, 12)
    with pytest.raises(ValueError, match="candidate_parents.*topologically ordered"):
        ops.eagle2_rerank(torch.tensor([1]), tokens, scores, parents.flip(1).contiguous(), 4)
    with pytest.raises(ValueError, match="candidate_tokens: expected values in"):
        ops.eagle2_rerank(torch.tensor([1]), -tokens, scores, parents, 4)
    with pytest.raises(ValueError, match="max_depth"):
        ops.eagle2_rerank(torch.tensor([1]), tokens, scores, parents, 6, max_depth=2)


@pytest.mark.parametrize("shape,k", [((7, 50), 5), ((3, 4, 33), 33), ((2, 1000), 1), ((5, 9), 0)])
def test_topk_helper_equals_its_definition(gen, shape, k):
    """The reference's fast top-k equals a stable descending sort cut after k, ties included."""
    from eagle_kernels.ops.reference import _topk_lowest_index_first

    values = torch.randint(-3, 3, shape, generator=gen).float()  # many ties
    values[..., :2] = -0.0
    values.view(-1)[::7] = float("-inf")
    want_values, want_index = torch.sort(values, dim=-1, descending=True, stable=True)
    got_values, got_index = _topk_lowest_index_first(values, k)
    assert torch.equal(got_index, want_index[..., :k])
    assert torch.equal(got_values, want_values[..., :k])
