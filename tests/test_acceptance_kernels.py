"""Triton acceptance and sampling kernels (CPU: Triton interpreter; GPU: compiled) vs reference.

Matching rule (discrete outputs). Greedy acceptance must equal the reference exactly. The
stochastic ops must equal it exactly wherever the reference's fp64 / renormalised arithmetic
and the kernel's fp32 arithmetic cannot legitimately disagree, i.e. unless one of the
reference's own decisions for a sequence lies within ``NEAR = 1e-5`` of its boundary,
recomputed here in fp64 from the reference probabilities:

* an acceptance draw: ``|u - residual[x]|`` (tree) or ``|u - p[x] / q[x]|`` (chain) < NEAR;
* the bonus draw: ``u * total`` within ``NEAR * total`` of a CDF step of the residual, or a
  chain residual ``max(0, p - q)`` whose total is < NEAR (the "else p" switch);
* top-p: a row of the sequence with a token whose "mass of strictly more probable tokens" lies
  within NEAR of top_p and which, with its exact ties, weighs more than NEAR (the kept set
  itself is then rounding-dependent).

fp32 sums over these vocabularies are accurate to ~1e-6, so NEAR leaves a wide margin. Which
sequences are near depends on the reference's inputs only, never on the kernel's output. Near
sequences are not excused but drawn again: the uniforms (:func:`uniforms_off_boundaries`) and
the logit rows (:func:`logits_off_top_p_boundaries`), so every sequence of the acceptance
checks is compared exactly. Only the target_probs checks, whose rows plant ties and -inf, excuse
fragile top-p rows, and each bounds their count (:func:`excuse_limit`).
Nothing else is loosened. The distribution tests compute the kernels' exact emitted-token
distributions in the two-cycle bigram harness (tests/bigram_harness.py): no draws, no noise.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference
from eagle_kernels.ops._validate import no_value_checks

import bigram_harness
from conftest import chain_parents, random_parents
from cpu_support import CPU_ISAS, using_cpu_isa
from cuda_support import assert_guards, gpu_when_present, guarded, needs_gpu, seed_note
from test_acceptance import GOLDEN_PARENTS, GOLDEN_TOKENS, one_hot_logits
from test_acceptance_cuda import planted_acceptance

NEAR = 1e-5

# The rate at which one target_probs row is excused (fragile, :func:`top_p_fragile`), and the
# chance budget of one check: measured 0.003 per 300-token top-p row. A CI run makes < 1000
# checks, so 1e-9 each keeps a false failure below 1e-6 per run.
TOP_P_ROW_RATE = 1e-2
CHANCE_PER_CHECK = 1e-9


def excuse_limit(count: int, rate: float) -> int:
    """The most of ``count`` independent cases, each excused with probability <= ``rate``, that
    one check may excuse: the smallest k with P(Binomial(count, rate) > k) <= CHANCE_PER_CHECK."""
    tail = 1.0
    for k in range(count + 1):
        tail -= math.comb(count, k) * rate ** k * (1 - rate) ** (count - k)
        if tail <= CHANCE_PER_CHECK:
            return k
    return count


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def same(got, want):
    return all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, want))


# ---- greedy ---------------------------------------------------------------------------------


@pytest.fixture(params=["triton", *(f"cpu-{isa}" for isa in CPU_ISAS)])
def greedy_backend(request):
    """A backend with greedy kernels that runs here: Triton (the interpreter on CPU), and the
    cpu backend in each instruction set the processor has."""
    if request.param.startswith("cpu-"):
        if DEVICE != "cpu":
            pytest.skip("cpu kernels take CPU tensors")
        with using_cpu_isa(request.param.removeprefix("cpu-")):
            yield "cpu"
        return
    yield request.param


def test_greedy_tree_golden(greedy_backend):
    _, _, paths = ops.build_tree(GOLDEN_PARENTS, max_depth=3)
    targets = torch.tensor([[6, 0, 9, 0, 0, 3, 0]])
    result = ops.greedy_accept_tree(GOLDEN_TOKENS, paths, one_hot_logits(targets, 128),
                                    backend=greedy_backend)
    assert result.output_tokens.tolist() == [[6, 9, 3, -1]]
    assert result.num_accepted.tolist() == [2]
    assert result.accepted_nodes.tolist() == [[0, 2, 5, -1]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_tree_planted_and_ties(gen, dtype, greedy_backend):
    """Small vocabularies: accidental matches, ties between paths and between logits."""
    for num_nodes, vocab in ((1, 3), (9, 4), (33, 6), (64, 3)):
        parents = random_parents(2, num_nodes, gen)
        tokens, paths, logits = planted_acceptance(parents, vocab, gen)
        logits = logits.round().to(dtype)  # rounding creates argmax ties
        assert same(ops.greedy_accept_tree(tokens, paths, logits, backend=greedy_backend),
                    reference.greedy_accept_tree(tokens, paths, logits)), seed_note(gen)


def test_greedy_argmax_ties_across_vocab_blocks(gen, greedy_backend):
    """vocab 5000 spans three 2048-wide blocks: the lowest index wins a tie between blocks."""
    tokens = torch.randint(0, 5000, (3, 4), generator=gen)
    logits = torch.randn(3, 4, 5000, generator=gen)
    logits[0, :, [100, 2100, 4500]] = 9.0
    logits[1, :, [4999, 2048]] = 9.0
    assert same(ops.greedy_accept_chain(tokens, logits, backend=greedy_backend),
                reference.greedy_accept_chain(tokens, logits)), seed_note(gen)


def test_greedy_chain_matches_reference(gen, greedy_backend):
    for _ in range(3):
        tokens = torch.randint(0, 3, (5, 7), generator=gen)
        logits = torch.randn(5, 7, 3, generator=gen)
        assert same(ops.greedy_accept_chain(tokens, logits, backend=greedy_backend),
                    reference.greedy_accept_chain(tokens, logits)), seed_note(gen)


@pytest.mark.parametrize("isa", CPU_ISAS)
def test_cpu_greedy_target_vocab_ties_and_nan(gen, isa):
    """SmolLM2's 49152-entry rows (several rows: the parallel argmax), planted ties in the last
    lanes and across the row, and NaN logits with value checks off (torch.argmax: the first NaN
    is the maximum)."""
    with using_cpu_isa(isa), no_value_checks():
        logits = torch.randn(2, 16, 49152, generator=gen)
        logits[0, :, [40000, 45000, 49151]] = 9.0
        logits[1, 2, [49147, 49151]] = 9.0
        logits[1, 5, [900, 777]] = float("nan")
        tokens = torch.randint(0, 49152, (2, 16), generator=gen)
        tokens[:, 1:] = logits.argmax(-1)[:, :-1]  # a chain the target accepts entirely
        tokens[1, 9] = 0
        parents = random_parents(2, 16, gen)
        _, _, paths = ops.build_tree(parents)
        assert same(ops.greedy_accept_chain(tokens, logits, backend="cpu"),
                    reference.greedy_accept_chain(tokens, logits)), seed_note(gen)
        assert same(ops.greedy_accept_tree(tokens, paths, logits, backend="cpu"),
                    reference.greedy_accept_tree(tokens, paths, logits)), seed_note(gen)


@pytest.mark.parametrize("isa", CPU_ISAS)
def test_cpu_greedy_garbage_paths_stay_in_bounds(gen, isa):
    """Paths with indices outside [-1, N) and rows that are not paths, checks bypassed: every
    write stays in its output."""
    with using_cpu_isa(isa):
        from eagle_kernels import _cpu

        for batch, nodes, num_paths, width in ((1, 1, 1, 1), (2, 5, 3, 4), (3, 9, 9, 2)):
            logits = torch.randn(batch, nodes, 37, generator=gen)
            tokens = torch.randint(0, 37, (batch, nodes), generator=gen)
            paths = torch.randint(-3, nodes + 3, (batch, num_paths, width), generator=gen,
                                  dtype=torch.int32)
            outputs = [guarded((batch, width), torch.int64), guarded((batch,), torch.int32),
                       guarded((batch, width), torch.int32), guarded((batch, nodes), torch.int64)]
            _cpu.greedy_accept(logits.data_ptr(), tokens.data_ptr(), paths.data_ptr(),
                               outputs[3][1].data_ptr(),
                               [inner.data_ptr() for _, inner in outputs[:3]], batch, nodes, 37,
                               num_paths, width)
            for buffer, _ in outputs:
                assert_guards(buffer, f"{isa} {seed_note(gen)}\n{paths}")


@pytest.mark.parametrize("isa", CPU_ISAS)
def test_cpu_greedy_answers_invalid_paths_as_the_gpu_kernels(gen, isa):
    """With value checks off, paths the op refuses (entries outside [-1, N), rows that do not
    start at a node, no row at all) get the GPU kernels' answer from the cpu kernel too: an
    entry outside the tree ends its path, a tree without a path row accepts the root alone."""
    if DEVICE != "cpu":
        pytest.skip("cpu kernels take CPU tensors")
    with using_cpu_isa(isa), no_value_checks():
        for batch, nodes, num_paths, width in ((1, 1, 1, 1), (2, 5, 3, 4), (3, 9, 9, 2),
                                               (4, 6, 2, 6)):
            logits = torch.randn(batch, nodes, 5, generator=gen)  # 5 tokens: paths get accepted
            tokens = torch.randint(0, 5, (batch, nodes), generator=gen)
            paths = torch.randint(-3, nodes + 3, (batch, num_paths, width), generator=gen,
                                  dtype=torch.int32)
            paths[0] = -1  # the first tree: no path row at all
            want = ops.greedy_accept_tree(tokens, paths, logits, backend="triton")
            got = ops.greedy_accept_tree(tokens, paths, logits, backend="cpu")
            assert same(got, want), (isa, paths, got, want, seed_note(gen))


# ---- target_probs ---------------------------------------------------------------------------


def _fragile_steps(logits, temperature, top_k, top_p):
    """fragile [R, V] and probs [R, V] of :func:`fragile_tokens`, and each token's step [R, V]
    fp64: its probability times its number of exact ties (itself included)."""
    probs = reference.target_probs(logits, temperature, top_k, 1.0).double()
    descending = torch.sort(probs, dim=-1, descending=True).values
    ascending = torch.flip(descending, [-1]).contiguous()
    before = torch.cumsum(descending, -1) - descending  # mass of the tokens sorted before
    count_greater = probs.shape[-1] - torch.searchsorted(ascending, probs, right=True)
    greater = before.gather(1, count_greater.clamp(max=probs.shape[-1] - 1))
    top_p = torch.as_tensor(top_p, dtype=torch.float64, device=probs.device)
    top_p = top_p.expand(probs.shape[0])
    fragile = ((greater - top_p.unsqueeze(1)).abs() < NEAR) & (top_p < 1).unsqueeze(1)
    ties = (torch.searchsorted(ascending, probs, right=True)
            - torch.searchsorted(ascending, probs, right=False))
    return fragile, probs, ties * probs


def fragile_tokens(logits, temperature, top_k, top_p) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, V] bool: the token's strictly-more-probable mass is within NEAR of top_p, so whether
    it is kept depends on rounding; and the top-k distribution [R, V] fp64 it is judged on.

    top_p >= 1 disables top-p exactly (reference and kernels alike), so no token is fragile."""
    fragile, probs, _ = _fragile_steps(logits, temperature, top_k, top_p)
    return fragile, probs


def top_p_fragile(logits, temperature, top_k, top_p) -> torch.Tensor:
    """[R] bool: a rounding-dependent token (see :func:`fragile_tokens`) weighs, with its exact
    ties, more than NEAR, so the kept set differs by more than NEAR of mass. Top-p keeps or
    drops tied tokens together: bf16 logits over 128256 tokens tie in groups of ~100 tokens of
    ~2e-6 each, ~2e-4 together (a per-token rule missed 21 of 200 such rows near top_p = 0.9).
    Lighter steps only move thresholds by < NEAR, which the decision margins below absorb."""
    fragile, _, step = _fragile_steps(logits, temperature, top_k, top_p)
    return (fragile & (step > NEAR)).any(-1)


SAMPLING = [{}, {"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.8},
            {"temperature": 0.5, "top_k": 10, "top_p": 0.6}]


@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: "-".join(map(str, p.items())) or "t1")
def test_target_probs_matches_reference(gen, params):
    logits = torch.randn(6, 300, generator=gen) * 2
    logits[0, 5] = logits[0, 9] = logits[0].max()  # ties at the top
    logits[1, :100] = float("-inf")
    logits[2] = logits[2].round()  # ties everywhere, top-k boundary ties kept
    got = ops.target_probs(logits.to(DEVICE), **params, backend="triton").cpu()
    want = reference.target_probs(logits, **params)
    fragile, _ = fragile_tokens(logits, params.get("temperature", 1.0), params.get("top_k", 0),
                                params.get("top_p", 1.0))
    # support: exact except rounding-dependent tokens; values: fp32 vs fp64 normalisation
    assert torch.equal((got > 0)[~fragile], (want > 0)[~fragile]), seed_note(gen)
    heavy = top_p_fragile(logits, params.get("temperature", 1.0), params.get("top_k", 0),
                          params.get("top_p", 1.0))
    torch.testing.assert_close(got[~heavy], want[~heavy], rtol=1e-5, atol=1e-6)
    assert int(heavy.sum()) <= excuse_limit(len(heavy), TOP_P_ROW_RATE), seed_note(gen)


def test_target_probs_per_row_parameters(gen):
    logits = torch.randn(4, 64, generator=gen).half()
    params = dict(temperature=torch.tensor([1.0, 0.5, 2.0, 0.8]),
                  top_k=torch.tensor([0, 1, 7, 64], dtype=torch.int32),
                  top_p=torch.tensor([0.3, 1.0, 0.9, 0.5]))
    got = ops.target_probs(logits, **params, backend="triton")
    want = reference.target_probs(logits, **params)
    fragile, _ = fragile_tokens(logits, *params.values())
    assert torch.equal((got > 0)[~fragile], (want > 0)[~fragile]), seed_note(gen)
    heavy = top_p_fragile(logits, *params.values())
    torch.testing.assert_close(got[~heavy], want[~heavy], rtol=1e-5, atol=1e-6)


# ---- stochastic: margins of the reference's decisions ---------------------------------------


def bonus_margin(residual: torch.Tensor, u: float) -> float:
    """Distance (relative to the total) from u * total to the nearest CDF step."""
    cdf = torch.cumsum(residual.double(), 0)
    total = float(cdf[-1])
    if total <= 0:
        return 0.0
    return float((cdf - u * total).abs().min()) / total


def tree_margin(tokens, parents, probs, accept_u, bonus_u, b) -> float:
    """Smallest margin of the reference's decisions for sequence b (its own walk, in fp64)."""
    num_nodes = tokens.shape[1]
    margin, node = float("inf"), 0
    residual = probs[b, 0].double().clone()
    while True:
        for child in [i for i in range(1, num_nodes) if int(parents[b, i]) == node]:
            token = int(tokens[b, child])
            value = float(residual[token] / residual.sum())
            u = float(accept_u[b, child])
            margin = min(margin, abs(u - value))
            if u < value:
                node, residual = child, probs[b, child].double().clone()
                break
            residual[token] = 0.0
        else:
            return min(margin, bonus_margin(residual, float(bonus_u[b])))


def chain_margin(tokens, draft, probs, accept_u, bonus_u, b) -> float:
    margin = float("inf")
    for node in range(1, tokens.shape[1]):
        token = int(tokens[b, node])
        p, q = probs[b, node - 1].double(), draft[b, node - 1].double()
        if float(q[token]) > 0:
            margin = min(margin, abs(float(accept_u[b, node]) - float(p[token] / q[token])))
        if float(accept_u[b, node]) * float(q[token]) >= float(p[token]):
            residual = (p - q).clamp(min=0)
            margin = min(margin, float(residual.sum()))
            residual = residual if float(residual.sum()) > 0 else p
            return min(margin, bonus_margin(residual, float(bonus_u[b])))
    return min(margin, bonus_margin(probs[b, -1], float(bonus_u[b])))


def compare_every_sequence(got, want, margins, note) -> None:
    """Exact per sequence. Every sequence's draws are off the reference's boundaries
    (:func:`uniforms_off_boundaries`) and its logit rows off top-p's
    (:func:`logits_off_top_p_boundaries`), so none is excused: a margin below NEAR here is a
    bug of the test."""
    for b in range(want.num_accepted.shape[0]):
        assert margins[b] >= NEAR, f"sequence {b}: margin {margins[b]} after the redraws {note}"
        for name, a, e in zip(want._fields, got, want):
            assert torch.equal(a[b].cpu(), e[b]), f"{name} of sequence {b} {note}"


# Uniforms of a sequence near a boundary are drawn again at most this often. One draw is near
# with probability ~0.6 for one op on the 32000- / 128256-token rows of the GPU tests (dense CDF
# steps put the bonus draw near one most often; ~1e-3 on the others), and for the worst of 400
# measured sequences 0.88 where the same draws run both ops (test_sampling_cuda.py): such a
# sequence stays near after all of them with probability 0.88^512 < 1e-28.
REDRAWS = 512


def node_probs(logits, params: dict) -> torch.Tensor:
    """The reference's per-node sampling distributions under ``params`` (ops' keywords)."""
    return reference._node_probs(logits, params.get("temperature", 1.0), params.get("top_k", 0),
                                 params.get("top_p", 1.0))


def uniforms_off_boundaries(batch: int, num_nodes: int, margin, gen):
    """accept_u [B, N] and bonus_u [B] deciding every sequence at least NEAR from the
    reference's boundaries (``margin(accept_u, bonus_u, b) >= NEAR``): a sequence's uniforms
    are drawn again while they are nearer. Where the draws fall depends on the reference's
    inputs only, so no sequence is excused for its draws: each is compared exactly (excusing
    them instead left large-vocabulary checks comparing no sequence in some runs)."""
    accept_u = torch.rand(batch, num_nodes, generator=gen)
    bonus_u = torch.rand(batch, generator=gen)
    for b in range(batch):
        draws = 1
        while margin(accept_u, bonus_u, b) < NEAR:
            assert draws < REDRAWS, f"sequence {b} near a boundary after {draws} draws"
            accept_u[b] = torch.rand(num_nodes, generator=gen)
            bonus_u[b] = torch.rand(1, generator=gen)[0]
            draws += 1
    return accept_u, bonus_u


# Logit rows with a fragile top-p step (:func:`top_p_fragile`) are drawn again at most this
# often. A row is fragile with probability ~0.1 at worst (measured: 36 of 350 128256-token bf16
# rows of random_logits at temperature 0.7, top_p 0.9; 12 of 150 fp32 rows of randn * 3 there;
# <= 0.03 for the other dtypes and vocabularies of these tests): taking 0.25, a row is still
# fragile after all of them with probability 0.25^32 < 1e-19, < 1e-15 over a run's rows.
ROW_REDRAWS = 32


def logits_off_top_p_boundaries(draw, params: dict, gen) -> torch.Tensor:
    """``draw(gen)``'s logits ([B, N, V] or [R, V], contiguous) with every row that is
    :func:`top_p_fragile` under ``params`` (ops' keywords; a tensor is per sequence, i.e. per
    index of the first dimension) replaced by the same row of a fresh draw while it is. Where
    the rows fall depends on the reference's inputs only, so no sequence is excused for its
    top-p rows (excusing them let some checks compare no sequence at all)."""
    logits = draw(gen)
    top_p = params.get("top_p", 1.0)
    if not isinstance(top_p, torch.Tensor) and top_p >= 1:
        return logits  # top-p off: no row is fragile (fragile_tokens)
    vocab = logits.shape[-1]
    rows_per_sequence = logits.shape[1] if logits.dim() == 3 else 1
    flat = logits.view(-1, vocab)

    def per_row(value):
        return (value.repeat_interleave(rows_per_sequence)
                if isinstance(value, torch.Tensor) else value)

    row_params = [per_row(params.get(name, default))
                  for name, default in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0))]
    rows = torch.arange(flat.shape[0])
    for draws in range(1, ROW_REDRAWS + 1):
        fragile = top_p_fragile(  # fp64 sorts of 128256-token rows: on the GPU where one is
            flat[rows].to(DEVICE),
            *(p[rows].to(DEVICE) if isinstance(p, torch.Tensor) else p for p in row_params))
        rows = rows[fragile.cpu()]
        if rows.numel() == 0:
            return logits
        assert draws < ROW_REDRAWS, f"rows {rows.tolist()} top-p fragile after {draws} draws"
        flat[rows] = draw(gen).view(-1, vocab)[rows].to(flat.dtype)
    raise AssertionError("unreachable")


def random_logits(batch, num_nodes, vocab, gen, hot=5):
    """Logits that favour the first `hot` ids, so draft tokens in [0, hot) are often accepted."""
    logits = torch.randn(batch, num_nodes, vocab, generator=gen)
    logits[..., :hot] += 2.5
    return logits


# top-p alone is covered by test_target_probs_matches_reference; the combined case runs the
# top-k and top-p searches through the walk (slow in the interpreter: kept small)
STOCHASTIC = [({}, 6), ({"temperature": 0.7}, 6), (SAMPLING[4], 3)]


@pytest.mark.parametrize("params,batch", STOCHASTIC, ids=["t1", "t0.7", "t0.5-k10-p0.6"])
def test_stochastic_tree_matches_reference(gen, params, batch):
    num_nodes, vocab = 8, 40
    parents = random_parents(batch, num_nodes, gen)
    tokens = torch.randint(0, 6, (batch, num_nodes), generator=gen)  # repeated sibling tokens
    logits = logits_off_top_p_boundaries(
        lambda g: random_logits(batch, num_nodes, vocab, g), params, gen)
    probs = node_probs(logits, params)
    margin = functools.partial(tree_margin, tokens, parents, probs)
    accept_u, bonus_u = uniforms_off_boundaries(batch, num_nodes, margin, gen)
    args = (tokens, parents, logits, accept_u, bonus_u)
    got = ops.stochastic_accept_tree(*(a.to(DEVICE) for a in args), **params, backend="triton")
    want = reference.stochastic_accept_tree(*args, **params)
    margins = [margin(accept_u, bonus_u, b) for b in range(batch)]
    compare_every_sequence(got, want, margins, seed_note(gen))


@pytest.mark.parametrize("params,batch", STOCHASTIC, ids=["t1", "t0.7", "t0.5-k10-p0.6"])
def test_stochastic_chain_matches_reference(gen, params, batch):
    num_nodes, vocab = 6, 40
    tokens = torch.randint(0, 6, (batch, num_nodes), generator=gen)
    draft = torch.softmax(random_logits(batch, num_nodes - 1, vocab, gen), -1)
    draft[0, :, 7] = 0.0  # q zero where p is not: residual keeps the full p there
    draft = draft / draft.sum(-1, keepdim=True)
    logits = logits_off_top_p_boundaries(
        lambda g: random_logits(batch, num_nodes, vocab, g), params, gen)
    probs = node_probs(logits, params)
    margin = functools.partial(chain_margin, tokens, draft, probs)
    accept_u, bonus_u = uniforms_off_boundaries(batch, num_nodes, margin, gen)
    args = (tokens, draft, logits, accept_u, bonus_u)
    got = ops.stochastic_accept_chain(*(a.to(DEVICE) for a in args), **params, backend="triton")
    want = reference.stochastic_accept_chain(*args, **params)
    margins = [margin(accept_u, bonus_u, b) for b in range(batch)]
    compare_every_sequence(got, want, margins, seed_note(gen))


def spread_logits(batch, num_nodes, vocab, hot_ids, gen):
    """Logits with almost all the mass (all but ~1e-3) on ``hot_ids``."""
    logits = torch.randn(batch, num_nodes, vocab, generator=gen)
    logits[..., hot_ids] += 12 + torch.randn(batch, num_nodes, len(hot_ids), generator=gen)
    return logits


@gpu_when_present
@pytest.mark.parametrize("kind", ["chain", "tree"])
@pytest.mark.parametrize("backend", ["triton"])  # the verdict credits the backend a GPU case names
def test_bonus_draw_across_vocabulary_chunks(gen, kind, backend):
    """A vocabulary of three chunks of the kernels' bonus draw (2048, 2048, 404 entries) with
    the mass on 60 ids spread over all three: the chosen chunk, the running sum carried into
    it and the removed / q-subtracted residual across chunks (the other tests' 40-token rows
    are one chunk). Every sequence compared exactly (uniforms_off_boundaries)."""
    batch, num_nodes, vocab = 12, 5, 4500
    hot = torch.randperm(vocab, generator=gen)[:90]
    logits = spread_logits(batch, num_nodes, vocab, hot[:60], gen)
    params = {} if kind == "chain" else {"temperature": 0.7}
    probs = node_probs(logits, params)
    if kind == "chain":  # drafted from q, whose mass half overlaps p's
        tokens = hot[30:][torch.randint(0, 60, (batch, num_nodes), generator=gen)]
        second = torch.softmax(spread_logits(batch, num_nodes - 1, vocab, hot[30:], gen), -1)
        margin = functools.partial(chain_margin, tokens, second, probs)
    else:
        tokens = hot[:10][torch.randint(0, 10, (batch, num_nodes), generator=gen)]
        second = random_parents(batch, num_nodes, gen)
        margin = functools.partial(tree_margin, tokens, second, probs)
    accept_u, bonus_u = uniforms_off_boundaries(batch, num_nodes, margin, gen)
    args = [a.to(DEVICE) for a in (tokens, second, logits, accept_u, bonus_u)]
    if kind == "chain":
        got = ops.stochastic_accept_chain(*args, backend=backend)
        want = reference.stochastic_accept_chain(*(a.cpu() for a in args))
    else:
        got = ops.stochastic_accept_tree(*args, max_depth=4, **params, backend=backend)
        want = reference.stochastic_accept_tree(*(a.cpu() for a in args), max_depth=4, **params)
    margins = [margin(accept_u, bonus_u, b) for b in range(batch)]
    compare_every_sequence(got, want, margins, seed_note(gen))


def test_stochastic_goldens():
    """The goldens of test_acceptance.py, through the Triton kernels."""
    tokens = torch.tensor([[3, 0, 1, 2]] * 2)
    parents = torch.tensor([[-1, 0, 0, 1]] * 2, dtype=torch.int32)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7], [0.25] * 4,
                                     [0.25] * 4])).expand(2, 4, 4).contiguous()
    accept = torch.tensor([[0.0, 0.6, 0.5, 0.0], [0.0, 0.4, 0.0, 0.15]])
    result = ops.stochastic_accept_tree(tokens, parents, logits, accept, torch.tensor([0.6, 0.2]),
                                        max_depth=2, backend="triton")
    assert result.output_tokens.tolist() == [[1, 2, -1], [0, 1, -1]]
    assert result.accepted_nodes.tolist() == [[0, 2, -1], [0, 1, -1]]
    tokens = torch.tensor([[2, 0, 1]] * 2)
    draft = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.6, 0.2]]).expand(2, 2, 3).contiguous()
    logits = torch.log(torch.tensor([[0.25, 0.5, 0.25], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8]]))
    result = ops.stochastic_accept_chain(tokens, draft, logits.expand(2, 3, 3).contiguous(),
                                         torch.tensor([[0.0, 0.4, 0.7], [0.0, 0.4, 0.1]]),
                                         torch.tensor([0.3, 0.95]), backend="triton")
    assert result.output_tokens.tolist() == [[0, 0, -1], [0, 1, 2]]
    assert result.num_accepted.tolist() == [1, 2]


def test_invariants_one_hot_target_accepts_all_and_suffix_is_minus_one(gen):
    """One-hot target along a path: all of it accepted (tree and chain); outputs past the bonus
    are -1; num_accepted equals the accepted node count."""
    batch, num_nodes = 3, 8
    parents = random_parents(batch, num_nodes, gen)
    _, _, paths = reference.build_tree(parents)
    tokens = torch.stack([torch.randperm(20, generator=gen)[:num_nodes] for _ in range(batch)])
    logits = torch.full((batch, num_nodes, 21), float("-inf"))
    logits[:, :, 20] = 0.0
    for b in range(batch):
        path = [n for n in paths[b, 0].tolist() if n >= 0]
        for here, nxt in zip(path, path[1:]):
            logits[b, here] = float("-inf")
            logits[b, here, tokens[b, nxt]] = 0.0
    uniforms = torch.rand(batch, num_nodes, generator=gen) * 0.999
    result = ops.stochastic_accept_tree(tokens, parents, logits, uniforms,
                                        torch.rand(batch, generator=gen), backend="triton")
    for b in range(batch):
        path = [n for n in paths[b, 0].tolist() if n >= 0]
        count = int(result.num_accepted[b])
        assert count == len(path) - 1
        assert result.accepted_nodes[b, :count + 1].tolist() == path
        assert int(result.output_tokens[b, count]) == 20
        assert bool((result.output_tokens[b, count + 1:] == -1).all())
        assert bool((result.accepted_nodes[b, count + 1:] == -1).all())
    chain_logits = one_hot_logits(torch.roll(tokens, -1, 1), 21)  # target says the next token
    draft = torch.full((batch, num_nodes - 1, 21), 1 / 21)
    chain = ops.stochastic_accept_chain(tokens, draft, chain_logits, uniforms,
                                        torch.rand(batch, generator=gen), temperature=0.01,
                                        backend="triton")
    assert chain.num_accepted.tolist() == [num_nodes - 1] * batch
    assert chain.output_tokens[:, :-1].tolist() == tokens[:, 1:].tolist()


# ---- statistics: exact distributions of the two-cycle bigram harness on the kernels --------
#
# bigram_harness.exact_reports integrates the op over its uniforms: the cells of the lossless
# algorithm's decision tree, each evaluated at its midpoint and probed at two corners, every
# parameter set in ONE batched kernel call (per-row temperature / top-k / top-p tensors), so the
# interpreter runs once per kind. Deterministic given the random tables: no false failures
# (EXACT_TOL = 1e-6 only absorbs fp32 rounding, measured ~1e-8), and any sampler off by more
# than ~1e-3 in total variation is rejected (test_acceptance.py shows wrong samplers failing the
# same checker).

EXACT_PARAMS = [{}, {"temperature": 0.7}, {"top_k": 3}, {"top_p": 0.8},
                {"temperature": 0.7, "top_p": 0.8}, {"temperature": 0.7, "top_k": 3, "top_p": 0.8}]
# The interpreter runs each program in Python (~0.3 s per tree row, ~0.08 s per chain row here,
# three rows per cell): on CPU a subset, whose cells cost what the old 150 / 200-draw smoke
# tests did; the host twins (test_sampling_cuda.py) and GPUs run every parameter set.
INTERPRETER_PARAMS = {"tree": [{"temperature": 0.7}], "chain": [{}]}
EXACT_OPS = {"tree": functools.partial(ops.stochastic_accept_tree, backend="triton"),
             "chain": functools.partial(ops.stochastic_accept_chain, backend="triton")}


@pytest.mark.parametrize("kind", ["tree", "chain"])
def test_emitted_tokens_follow_the_target_exactly(gen, kind):
    """First emitted token ~ target_probs at the root and the first two ~ p(x1) p(x2 | x1),
    exactly (compiled on a GPU: every parameter set; interpreted on CPU: a subset)."""
    params_list = EXACT_PARAMS if torch.cuda.is_available() else INTERPRETER_PARAMS[kind]
    target, draft = bigram_harness.exact_tables(gen, params_list)
    reports = bigram_harness.exact_reports(kind, EXACT_OPS[kind], target, draft, params_list,
                                           device=DEVICE)
    for params, report in zip(params_list, reports):
        assert bigram_harness.exact_ok(report), f"{params}: {report} {seed_note(gen)}"


def test_seeded_determinism(gen):
    batch, num_nodes, vocab = 4, 8, 30
    parents = random_parents(batch, num_nodes, gen)
    args = (torch.randint(0, 5, (batch, num_nodes), generator=gen), parents,
            random_logits(batch, num_nodes, vocab, gen),
            torch.rand(batch, num_nodes, generator=gen), torch.rand(batch, generator=gen))
    runs = [ops.stochastic_accept_tree(*(a.to(DEVICE) for a in args), temperature=0.7,
                                       backend="triton") for _ in range(2)]
    assert same(runs[0], runs[1])


@needs_gpu
@pytest.mark.parametrize("backend", ["triton"])  # the verdict credits the backend a GPU case names
def test_gpu_large_vocab_matches_reference(gen, backend):
    """Real vocabulary sizes and bf16 logits on the GPU (several vocab blocks per row)."""
    for vocab, params in ((32000, {}), (128256, {"temperature": 0.7, "top_p": 0.9}),
                          (151936, {"top_k": 50})):
        batch, num_nodes = 4, 6
        parents = chain_parents(batch, num_nodes)
        logits = logits_off_top_p_boundaries(  # bf16 ties: ~0.1 of the 128256-token rows
            lambda g: random_logits(batch, num_nodes, vocab, g).to(torch.bfloat16).float(),
            params, gen)
        tokens = torch.randint(0, 5, (batch, num_nodes), generator=gen)
        probs = node_probs(logits, params)
        margin = functools.partial(tree_margin, tokens, parents, probs)
        accept_u, bonus_u = uniforms_off_boundaries(batch, num_nodes, margin, gen)
        args = (tokens, parents, logits, accept_u, bonus_u)
        got = ops.stochastic_accept_tree(*(a.cuda() for a in args), **params, backend=backend)
        want = reference.stochastic_accept_tree(*args, **params)
        margins = [margin(accept_u, bonus_u, b) for b in range(batch)]
        compare_every_sequence(got, want, margins, f"vocab {vocab} {seed_note(gen)}")


@needs_gpu
@pytest.mark.parametrize("backend", ["triton"])  # the verdict credits the backend a GPU case names
def test_gpu_greedy_matches_reference(gen, backend):
    for dtype in (torch.float32, torch.bfloat16):
        parents = random_parents(8, 60, gen)
        tokens, paths, logits = planted_acceptance(parents, 8, gen)
        logits = torch.cat([logits, torch.randn(8, 60, 32000, generator=gen) - 10], -1).to(dtype)
        args = (tokens.cuda(), paths.cuda(), logits.cuda())
        assert same(ops.greedy_accept_tree(*args, backend=backend),
                    reference.greedy_accept_tree(*args))
