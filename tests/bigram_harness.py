"""A two-cycle speculative loop against a synthetic bigram target, for sampler distributions.

The target and the draft are next-token tables over a vocabulary of 6 (the target never says
token 5 after token 0). Each draw runs one speculative cycle from token 0 (a top-2 depth-2
draft tree, or a 2-token chain sampled from the draft) and, when the cycle emitted only one
token, a second cycle from it. The first emitted token must follow the processed target
(temperature / top-k / top-p) after token 0, and the first two tokens its joint.
:func:`exact_reports` computes an op's distribution of those EXACTLY (no draws, hence no false
failures and no sampling noise: see the section below); :func:`first_two_tokens` draws
samples (used for determinism checks). ``backend`` and ``device`` pick the implementation.
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


# ---- exact distributions: integrate the op over its uniforms --------------------------------
#
# Given the draft tree (or draft chain) of a cycle, an acceptance op's output is a deterministic
# function of its uniforms, piecewise constant on boxes: each accept uniform is compared with one
# threshold (an acceptance probability), the bonus uniform with the CDF steps of a residual. The
# lossless algorithm's decision tree (enumerated below in fp64 from the same target_probs rows the
# op is given) splits [0, 1)^(N + 1) into cells: the uniforms it consults lie in intervals, the
# others are free. Evaluating the op once at each cell's midpoint and weighting its output by the
# cell's volume (times the probability of the chain's draft tokens) gives the op's emitted-token
# distribution EXACTLY, provided the op is constant on every cell. That proviso is checked by two
# more rows per cell: the consulted uniforms PROBE inside each edge (the "low" and "high"
# corners) and the free ones at 0 and at the largest float32 below 1. A wrong threshold more than
# PROBE away from the right one flips the op's output at a corner; a wrong threshold closer than
# that moves at most PROBE of mass per breakpoint. So the checker rejects every sampler whose
# first two emitted tokens are more than (breakpoints x PROBE, about 1e-3) from the target in
# total variation, far below the 0.01 required, and a correct sampler passes deterministically.
# All cells (and all parameter sets) go to the op in ONE batched call.

PROBE = 1e-5  # fp32 thresholds and CDF steps are within ~1e-7 of the fp64 ones: a wide margin
U_MAX = float.fromhex("0x1.fffffep-1")  # the largest float32 uniform below 1
EXACT_TOL = 1e-6  # fp64 sums of cell volumes; see test comments for what may sit inside it
NONE = VOCAB  # label of "no second token in this cycle" (num_accepted == 0)


def _bonus_cells(residual):
    """[(token, lo, hi)]: inverse-CDF cells of the bonus uniform for an fp64 residual."""
    cdf = torch.cumsum(residual, 0) / residual.sum()
    cells, lo = [], 0.0
    for token in range(len(residual)):
        hi = 1.0 if token == len(residual) - 1 else float(cdf[token])
        if float(residual[token]) > 0 and hi > lo:
            cells.append((token, lo, hi))
        lo = max(lo, hi)
    return cells


def _tree_leaves(root, processed, draft, depth):
    """Cells of one tree cycle from ``root`` until ``depth`` tokens are emitted (or the bonus):
    [(emitted tokens, {uniform column: (lo, hi)}, volume)], bonus column = 7."""
    tokens, parents = top2_tree(root, draft)
    children = [[c for c in range(len(parents)) if parents[c] == n] for n in range(len(parents))]
    leaves = []

    def walk(node, emitted, box, volume):
        if len(emitted) == depth:
            leaves.append((emitted, box, volume))
            return
        residual = processed[tokens[node]].clone()
        for child in children[node]:
            token = tokens[child]
            accept = float(residual[token] / residual.sum())
            if accept > 0:
                walk(child, emitted + [token], {**box, child: (0.0, accept)}, volume * accept)
            if accept >= 1:
                return
            box, volume = {**box, child: (accept, 1.0)}, volume * (1 - accept)
            residual[token] = 0.0
        for token, lo, hi in _bonus_cells(residual):
            leaves.append((emitted + [token], {**box, len(tokens): (lo, hi)}, volume * (hi - lo)))

    walk(0, [], {}, 1.0)
    return tokens, leaves


def _chain_leaves(root, processed, draft, depth):
    """Cells of one chain cycle from ``root``, the chain's draft tokens enumerated: [(tokens,
    emitted, box, volume x draft probability)], bonus column = 3. With depth 1 only the first
    draft token matters to the label; the second is fixed to its most likely value."""
    out = []
    for first in torch.nonzero(draft[root] > 0).flatten().tolist():
        seconds = (torch.nonzero(draft[first] > 0).flatten().tolist() if depth == 2
                   else [int(draft[first].argmax())])
        for second in seconds:
            tokens = [root, first, second]

            def walk(node, emitted, box, volume, tokens=tokens):
                if len(emitted) == depth:
                    out.append((tokens, emitted, box, volume))
                    return
                p, q = processed[tokens[node - 1]], draft[tokens[node - 1]].double()
                token = tokens[node]
                accept = min(1.0, float(p[token] / q[token]))
                if accept > 0:
                    walk(node + 1, emitted + [token], {**box, node: (0.0, accept)},
                         volume * accept)
                if accept < 1:
                    residual = (p - q).clamp(min=0)
                    residual = residual if float(residual.sum()) > 0 else p
                    for bonus, lo, hi in _bonus_cells(residual):
                        out.append((tokens, emitted + [bonus],
                                    {**box, node: (accept, 1.0), 3: (lo, hi)},
                                    volume * (1 - accept) * (hi - lo)))

            walk(1, [], {}, float(draft[root, first]) *
                 (float(draft[first, second]) if depth == 2 else 1.0))
    return out


def exact_tables(gen, params_list, margin=1e-5):
    """bigram_tables, redrawn while a top-p boundary is rounding-dependent: a token whose
    strictly-more-probable mass is within ``margin`` of top_p may be kept by fp32 kernels and
    dropped by the fp64 reference (both right). Continuous random tables hit that with
    probability ~1e-4 per draw; conditioning on missing it changes nothing else."""
    while True:
        target, draft = bigram_tables(gen)
        fragile = False
        for params in params_list:
            top_p = params.get("top_p", 1.0)
            if top_p >= 1:
                continue
            probs = reference.target_probs(torch.log(target), params.get("temperature", 1.0),
                                           params.get("top_k", 0), 1.0).double()
            greater = (probs.unsqueeze(1) * (probs.unsqueeze(1) > probs.unsqueeze(2))).sum(-1)
            fragile |= bool(((greater - top_p).abs() < margin).any())
        if not fragile:
            return target, draft


def _per_row_params(params_list, index):
    """Scalars for one parameter set; per-row tensors (one set per row) for several."""
    if len(params_list) == 1:
        return dict(params_list[0])
    pick = lambda key, default: [params_list[i].get(key, default) for i in index]
    return dict(temperature=torch.tensor(pick("temperature", 1.0), dtype=torch.float32),
                top_k=torch.tensor(pick("top_k", 0), dtype=torch.int64),
                top_p=torch.tensor(pick("top_p", 1.0), dtype=torch.float32))


def exact_reports(kind, op, target, draft, params_list, device="cpu"):
    """The exact first-token and first-two-token distributions of ``op`` in the two-cycle
    harness (cycle 1 from token 0; cycle 2 from the first token when cycle 1 emitted one), for
    every parameter set at once (one batched call of ``op``), against the processed target.

    ``kind`` is "tree" (``op`` has stochastic_accept_tree's signature, called on the top-2
    depth-2 tree with max_depth=2) or "chain" (stochastic_accept_chain on a 2-token draft
    chain). Returns one dict per parameter set: ``first_error`` / ``joint_error`` (largest
    absolute error of a probability), ``first_tv`` / ``joint_tv``, ``nonconstant`` (cells where
    the op's output moved between the midpoint and a probe corner) and ``cells``.
    """
    cells = []  # (params index, root, depth, tree tokens, box, volume)
    for index, params in enumerate(params_list):
        processed = reference.target_probs(torch.log(target), **params).double()
        for root, depth in [(0, 2)] + [(r, 1) for r in range(VOCAB)]:
            if kind == "tree":
                tokens, leaves = _tree_leaves(root, processed, draft, depth)
                cells += [(index, root, depth, tokens, box, volume) for _, box, volume in leaves]
            else:
                cells += [(index, root, depth, tokens, box, volume)
                          for tokens, _, box, volume in _chain_leaves(root, processed, draft,
                                                                      depth)]
    count, num_nodes = len(cells), len(cells[0][3])
    columns = num_nodes + 1  # accept uniforms, then the bonus uniform
    mid = torch.full((count, columns), 0.5, dtype=torch.float64)
    low = torch.zeros(count, columns, dtype=torch.float64)
    high = torch.full((count, columns), U_MAX, dtype=torch.float64)
    for row, (_, _, _, _, box, _) in enumerate(cells):
        for column, (lo, hi) in box.items():
            mid[row, column] = (lo + hi) / 2
            inset = PROBE if hi - lo > 2 * PROBE else (hi - lo) / 2
            low[row, column], high[row, column] = lo + inset, hi - inset
    uniforms = torch.cat([mid, low, high]).float().clamp(max=U_MAX)
    tokens = torch.tensor([cell[3] for cell in cells]).repeat(3, 1)
    logits = torch.log(target[tokens])
    params = _per_row_params(params_list, [cell[0] for cell in cells] * 3)
    params = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
    accept_u, bonus_u = uniforms[:, :num_nodes].contiguous(), uniforms[:, num_nodes].contiguous()
    if kind == "tree":
        _, parents = top2_tree(0, draft)
        second = torch.tensor(parents, dtype=torch.int32).expand(3 * count, -1).contiguous()
        extra = dict(max_depth=2)
    else:
        second = torch.stack([draft[tokens[:, 0]], draft[tokens[:, 1]]], 1)
        extra = {}
    result = op(tokens.to(device), second.to(device), logits.to(device), accept_u.to(device),
                bonus_u.to(device), **extra, **params)
    out, accepted = result.output_tokens.cpu(), result.num_accepted.cpu()
    first = out[:, 0]
    second_token = torch.where(accepted >= 1, out[:, 1], NONE)
    depth = torch.tensor([cell[2] for cell in cells]).repeat(3)
    label = torch.where(depth == 2, first * (VOCAB + 1) + second_token, first)
    label = label.view(3, count)
    moved = (label[1:] != label[:1]).any(0)
    first, second_token = first[:count], second_token[:count]
    reports = []
    for index, params in enumerate(params_list):
        processed = reference.target_probs(torch.log(target), **params).double()
        cycle1 = torch.zeros(VOCAB, VOCAB + 1, dtype=torch.float64)
        cycle2 = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
        bad = int(sum(bool(moved[row]) for row, cell in enumerate(cells) if cell[0] == index))
        for row, (i, root, depth_, _, _, volume) in enumerate(cells):
            a, b = int(first[row]), int(second_token[row])
            if i != index:
                continue
            if not (0 <= a < VOCAB and 0 <= b <= VOCAB):
                bad += 1
                continue
            if depth_ == 2:
                cycle1[a, b] += volume
            else:
                cycle2[root, a] += volume
        joint = cycle1[:, :VOCAB] + cycle1[:, VOCAB:] * cycle2
        first_got, first_want = cycle1.sum(1), processed[0]
        joint_want = processed[0].unsqueeze(1) * processed
        reports.append(dict(
            first_error=float((first_got - first_want).abs().max()),
            joint_error=float((joint - joint_want).abs().max()),
            first_tv=0.5 * float((first_got - first_want).abs().sum()),
            joint_tv=0.5 * float((joint - joint_want).abs().sum()),
            nonconstant=bad, cells=sum(cell[0] == index for cell in cells)))
    return reports


def exact_ok(report) -> bool:
    """The checker's verdict: the op's exact distribution is the target's and the op is constant
    on every cell (so the midpoint evaluation was exact)."""
    return (report["nonconstant"] == 0 and report["first_error"] <= EXACT_TOL
            and report["joint_error"] <= EXACT_TOL)
