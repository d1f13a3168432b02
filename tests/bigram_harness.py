"""A two-cycle speculative loop against a synthetic bigram target, for sampler statistics.

The target and the draft are next-token tables over a vocabulary of 6 (the target never says
token 5 after token 0). Each draw runs one speculative cycle from token 0 (a top-2 depth-2
draft tree, or a 2-token chain sampled from the draft) and, when the cycle emitted only one
token, a second cycle from it. The first emitted token must follow the processed target
(temperature / top-k / top-p) after token 0, and the first two tokens its joint: tested by
chi-square and total variation in :func:`check_distribution`. ``backend`` and ``device`` pick
the implementation under test.
"""

from __future__ import annotations

import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference

VOCAB = 6


def bigram_tables(gen):
    """Target and draft next-token tables [V, V]; the target never says token 5 after 0."""
    target = torch.rand(VOCAB, VOCAB, generator=gen) + 0.05
    target[0, 5] = 0.0
    draft = torch.rand(VOCAB, VOCAB, generator=gen) + 0.05
    return target / target.sum(1, keepdim=True), draft / draft.sum(1, keepdim=True)


def top2_tree(root, draft):
    """Depth-2 tree of the draft's deterministic top-2 children: 7 nodes."""
    first = torch.sort(draft[root], descending=True, stable=True).indices[:2].tolist()
    tokens = [root] + first
    for child in first:
        tokens += torch.sort(draft[child], descending=True, stable=True).indices[:2].tolist()
    return tokens, [-1, 0, 0, 1, 1, 2, 2]


def tree_cycle(roots, target, draft, gen, params, backend="auto", device="cpu"):
    """One speculative cycle per root with stochastic_accept_tree: [R, 3] tokens, [R] counts."""
    out_tokens = torch.full((len(roots), 3), -1, dtype=torch.int64)
    out_count = torch.zeros(len(roots), dtype=torch.int32)
    for root in roots.unique().tolist():
        rows = torch.nonzero(roots == root).flatten()
        tree_tokens, parents = top2_tree(root, draft)
        count = len(rows)
        tokens = torch.tensor(tree_tokens).expand(count, -1).contiguous()
        result = ops.stochastic_accept_tree(
            tokens.to(device), torch.tensor(parents, dtype=torch.int32, device=device)
            .expand(count, -1).contiguous(), torch.log(target[tokens]).to(device),
            torch.rand(count, 7, generator=gen).to(device),
            torch.rand(count, generator=gen).to(device), max_depth=2, backend=backend, **params)
        out_tokens[rows], out_count[rows] = result.output_tokens.cpu(), result.num_accepted.cpu()
    return out_tokens, out_count


def chain_cycle(roots, target, draft, gen, params, backend="auto", device="cpu"):
    """One cycle with a 2-token chain sampled from the draft, then stochastic_accept_chain."""
    count = len(roots)
    first = torch.multinomial(draft[roots], 1, generator=gen).flatten()
    second = torch.multinomial(draft[first], 1, generator=gen).flatten()
    tokens = torch.stack([roots, first, second], 1)
    result = ops.stochastic_accept_chain(
        tokens.to(device), torch.stack([draft[roots], draft[first]], 1).to(device),
        torch.log(target[tokens]).to(device), torch.rand(count, 3, generator=gen).to(device),
        torch.rand(count, generator=gen).to(device), backend=backend, **params)
    return result.output_tokens.cpu(), result.num_accepted.cpu()


def first_two_tokens(cycle, draws, target, draft, gen, params):
    roots = torch.zeros(draws, dtype=torch.int64)
    tokens, accepted = cycle(roots, target, draft, gen, params)
    first, second = tokens[:, 0].clone(), tokens[:, 1].clone()
    again = accepted == 0  # one token this cycle: the second comes from a new cycle
    more, _ = cycle(first[again], target, draft, gen, params)
    second[again] = more[:, 0]
    return first, second


def chi_square_p_value(observed, expected):
    """Pearson chi-square p-value; cells with expected < 5 pooled. Zero-expected must be empty."""
    assert int(observed[expected == 0].sum()) == 0, "a zero-probability token was emitted"
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)]).double()
    exp = torch.cat([expected[~small], expected[small].sum().view(1)]).double()
    keep = exp > 0
    stat = (((obs - exp) ** 2)[keep] / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0))


def check_distribution(cycle, draws, params, gen, max_tv, min_p_value):
    """First token and the joint of the first two against the processed target (chi-square
    p-value above ``min_p_value`` and total variation below ``max_tv`` for both)."""
    target, draft = bigram_tables(gen)
    first, second = first_two_tokens(cycle, draws, target, draft, gen, params)
    processed = reference.target_probs(torch.log(target), **params)  # row t: after token t
    joint = processed[0].unsqueeze(1) * processed  # P(first = a, second = b)
    observed_first = torch.bincount(first, minlength=VOCAB)
    observed_joint = torch.bincount(first * VOCAB + second, minlength=VOCAB**2)
    for observed, expected in ((observed_first, processed[0]), (observed_joint, joint.flatten())):
        p_value = chi_square_p_value(observed, expected * draws)
        total_variation = 0.5 * float((observed / draws - expected).abs().sum())
        note = f"p={p_value:.3g} tv={total_variation:.4f} seed={gen.initial_seed()}"
        assert p_value > min_p_value, note
        assert total_variation < max_tv, note
