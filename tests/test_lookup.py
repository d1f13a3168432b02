"""Context drafts (prompt lookup) in the cycles and plainly decoded steps of speculative calls:
what the index proposes, greedy output equal to plain decoding token for token whatever it
proposes (batch rows of different lengths and proposals, EOS cuts inside an accepted chain,
budget caps, a fallback mid-call and calls that start plainly), sampled output distributed as
the target's (against its exact joint), the pause check, the head fed after a context cycle,
and the tree budget kept out of it."""

from __future__ import annotations

import pytest
import torch

from eagle_kernels.runtime import Engine, SamplingConfig, TreeConfig
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head
from eagle_kernels.runtime.lookup import ContextIndex
from eagle_kernels.runtime.tree_budget import AdaptiveTree, CycleCost
from runtime_helpers import tiny_target

SMALL = TreeConfig(1, 0, 2)


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=5)


def test_the_longest_latest_match_proposes_as_many_tokens_as_it_matched():
    index = ContextIndex([[1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3],   # (1, 2, 3) at 0: 9 5 2
                          [1, 2, 3, 9, 5, 2, 3, 7, 4, 2, 3],   # only (2, 3), latest at 5: 7 4
                          [5, 6, 7, 6],                        # (7, 6) never seen; no 1-grams
                          [8]])
    assert index.propose(0, 4) == [9, 5, 2]
    assert index.propose(1, 4) == [7, 4] and index.propose(1, 1) == [7]
    assert index.propose(2, 4) == [] and index.propose(3, 4) == []
    index.extend(1, [7])  # now (2, 3, 7) ends the row: it followed at 5..7, then came 4
    assert index.propose(1, 4) == [4, 2, 3]


def test_an_index_grown_token_by_token_equals_one_built_at_once():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 6, (200,), generator=gen).tolist()  # many repeated n-grams
    grown = ContextIndex([tokens[:17]])
    for token in tokens[17:]:
        grown.extend(0, [token])
    whole = ContextIndex([tokens])
    assert grown.tokens == whole.tokens and grown.follower == whole.follower
    assert grown.propose(0, 4) == whole.propose(0, 4) != []


def repetitive_prompts(gen: torch.Generator) -> list[list[int]]:
    """Prompts of different lengths that repeat themselves, so the context proposes drafts."""
    bases = [torch.randint(0, 299, (n,), generator=gen).tolist() for n in (5, 8, 11)]
    return [base + base + base[:3] for base in bases]


def echo_prompts(target) -> list[list[int]]:
    """Prompts followed by their own plain reply and the prompt again: the replies copy
    the earlier reply (row 2 exactly), tokens a draft brings in before the reply has them."""
    gen = torch.Generator().manual_seed(3)
    bases = [torch.randint(0, 299, (n,), generator=gen).tolist() for n in (5, 8, 11)]
    replies = Engine(target).generate(bases, 12, speculative=False).tokens
    return [base + reply + base for base, reply in zip(bases, replies)]


def plain_policy(prior_alpha: float) -> AdaptiveTree:
    """One tree whose cycle (14 ms) beats a 10 ms plain step only while alpha stays high; its
    verify costs a plain step (as on a GPU), so batched steps take context drafts."""
    return AdaptiveTree({SMALL: CycleCost(0.004, 0.01)}, prior_alpha=prior_alpha,
                        step_seconds=0.01, online_timing=False)


@pytest.mark.parametrize("max_new_tokens,eos_at", [(40, None), (40, (2, 3)), (13, None)])
def test_context_drafts_keep_plain_greedy_output(target, monkeypatch, max_new_tokens, eos_at):
    """A call that decodes plainly from the start (the policy expects no tree to pay) verifies
    context drafts, accepts some, and emits exactly the plain greedy tokens, also when EOS cuts
    an accepted chain or the budget ends inside where a draft would have gone (drafts are
    capped to the tokens a row may still record)."""
    from eagle_kernels.runtime import generation

    cuts, record = [], generation._Call.record

    def watched(self, new_tokens, counts):  # (produced, recorded) per row of every chain
        recorded = record(self, new_tokens, counts)
        if new_tokens.shape[1] > 1:
            cuts.extend(zip(counts.tolist(), recorded.tolist()))
        return recorded

    monkeypatch.setattr(generation._Call, "record", watched)
    prompts = echo_prompts(target)
    plain = Engine(target).generate(prompts, 40, speculative=False).tokens
    eos = [] if eos_at is None else [plain[eos_at[0]][eos_at[1]]]  # a drafted token
    reference = Engine(target).generate(prompts, max_new_tokens, eos_token_ids=eos,
                                        speculative=False)
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=plain_policy(0.0))
    out = engine.generate(prompts, max_new_tokens, eos_token_ids=eos)
    assert out.tokens == reference.tokens and out.stop_reasons == reference.stop_reasons
    stats = out.stats
    assert stats.mode == "speculative" and "with context drafts" in stats.fallback
    assert stats.plain_steps == stats.cycles and stats.lookup_accepted > 0, stats.summary()
    assert stats.tau == 1.0  # no cycle of a tree ran
    assert stats.lookup_accepted <= sum(map(len, out.tokens)) - stats.cycles - 1
    assert all(recorded <= produced for produced, recorded in cuts)
    # EOS inside an accepted chain: a row recorded fewer tokens than the chain produced
    assert any(0 < recorded < produced for produced, recorded in cuts) == (eos_at is not None)


def test_context_drafts_take_over_mid_call_and_can_be_turned_off(target):
    """An optimistic prior speculates first; once the random head's misses make plain decoding
    the better choice the same call goes on with context drafts; ``prompt_lookup=False`` keeps
    plain steps plain. Every way, the plain greedy tokens."""
    prompts = repetitive_prompts(torch.Generator().manual_seed(4))
    reference = Engine(target).generate(prompts, 40, speculative=False).tokens
    head = new_draft_head(EAGLE3, target)
    engine = Engine(target, head, tree_policy=plain_policy(0.9))
    out = engine.generate(prompts, 40)
    assert out.tokens == reference
    assert out.stats.tree_cycles and "plain decoding from cycle" in out.stats.fallback
    assert out.stats.lookup_steps > 0 and out.stats.lookup_accepted > 0, out.stats.summary()
    engine.prompt_lookup = False
    off = engine.generate(prompts, 40)
    assert off.tokens == reference and off.stats.lookup_steps == 0 and off.stats.plain_steps


def test_sampling_with_top_k_1_verifies_context_drafts_to_the_greedy_tokens(target):
    """A sampling call takes context drafts through rejection sampling: with top_k = 1 the
    target's distribution is its argmax, so the tokens are exactly the plain greedy ones while
    drafted tokens are accepted (and prompt_lookup=False keeps its steps plain)."""
    prompts = echo_prompts(target)
    greedy = Engine(target).generate(prompts, 30, speculative=False).tokens
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=plain_policy(0.0))
    sampling = SamplingConfig(temperature=0.8, top_k=1, seed=1)
    out = engine.generate(prompts, 30, sampling=sampling)
    assert out.tokens == greedy
    assert out.stats.lookup_steps > 0 and out.stats.lookup_accepted > 0, out.stats.summary()
    engine.prompt_lookup = False
    off = engine.generate(prompts, 30, sampling=sampling)
    assert off.tokens == greedy and off.stats.lookup_steps == 0


def de_bruijn(vocab: int, order: int) -> list[int]:
    """A sequence over [0, vocab) with every ``order``-gram once (greedy: the largest token
    whose n-gram is new): the context then matches every ``order``-token suffix but the one it
    ends with, so nearly every step of a reply has a context draft."""
    sequence, seen = [0] * (order - 1), set()
    while True:
        head = tuple(sequence[len(sequence) - order + 1:])
        token = next((t for t in range(vocab - 1, -1, -1) if head + (t,) not in seen), None)
        if token is None:
            return sequence
        seen.add(head + (token,))
        sequence.append(token)


def first_tokens_probs(target, prompt: list[int], sampling: SamplingConfig, count: int):
    """The target's exact sampling distribution of the first ``count`` generated tokens:
    [V] * count probabilities, from one forward over every prefix (no draws)."""
    from eagle_kernels.ops import reference
    from eagle_kernels.runtime.drafting import causal_tree_mask

    vocab = target.vocab_size
    probs = torch.ones(())
    for step in range(count):
        ends = torch.cartesian_prod(*[torch.arange(vocab)] * step) if step else None
        rows = [prompt] if ends is None else [prompt + end.flatten().tolist() for end in ends]
        ids = torch.tensor(rows)
        batch, width = ids.shape
        cache = target.allocate_cache(batch, width)
        with torch.inference_mode():
            hidden, _ = target(ids, torch.arange(width).expand(batch, -1), cache,
                               causal_tree_mask(batch, width, ids.device))
            logits = target.logits(hidden[:, -1])
        p = reference.target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        probs = probs.unsqueeze(-1) * p.reshape([vocab] * step + [vocab])
    return probs


@pytest.mark.parametrize("where", ["plain steps", "cycles"])
def test_sampling_with_context_drafts_keeps_the_target_distribution(where, gen):
    """The first three tokens of 4000 sampled replies against the target's exact joint
    distribution, cell by cell (V**3 cells per prompt, two prompts). Drafts verified in the
    plain steps the tree budget falls back to (V = 6; one prompt with a draft at nearly every
    step, one whose rows mostly have none, so chains are padded), or in place of a fixed tree's
    cycles (V = 4; two prompts with every 3-token suffix seen: 3+-token matches replace a tree).

    Threshold: Bernstein's inequality per cell, |f - p| <= sqrt(2 p (1 - p) L / n) + 2 L / (3 n)
    with L = ln(2 * cells / 1e-6): the union over the 2 V**3 cells fails with probability
    <= 1e-6 for a correct sampler (the reference joint is computed, not drawn), whatever the
    sampler's seed (fresh each run). Power (sampler seed 11): greedy acceptance of the drafts
    puts a cell 8.5 bounds off in plain steps / 2.3 in cycles, acceptance reading the logits of
    the node after 3.5 / 7.3, a chain uniform reused as the bonus uniform 1.7 in plain steps
    (0.5 in cycles: not caught there)."""
    import math

    vocab, rows, count = (6 if where == "plain steps" else 4), 2000, 3
    target = tiny_target(seed=2, vocab=vocab)
    sampling = SamplingConfig(temperature=2.0, seed=int(torch.randint(2**31, (), generator=gen)))
    print(f"sampler seed {sampling.seed}")
    head = new_draft_head(EAGLE3, target)
    if where == "plain steps":
        prompts = (de_bruijn(vocab, 2), [0, 1, 2, 0, 3, 4, 0, 1])  # the second: few recur
        engine = Engine(target, head, tree_policy=plain_policy(0.0))
    else:
        prompts = (de_bruijn(vocab, 3), de_bruijn(vocab, 3)[::-1])
        engine = Engine(target, head, TreeConfig(2, 2, 4))
    out = engine.generate([prompts[0]] * rows + [prompts[1]] * rows, count + 1,
                          sampling=sampling)
    stats = out.stats
    drafted = stats.lookup_steps if where == "plain steps" else stats.context_cycles
    # Drafts must be verified and accepted for the test to test them: accepted tokens are a sum
    # over 2 * rows independent rows of at most `count` each, measured at 1303-1399 (plain
    # steps) / 1850-1917 (cycles) over 6 sampler seeds; Hoeffding: P(sum <= rows // 4 = 500)
    # <= exp(-2 * 800**2 / (2 * rows * count**2)) < 1e-15 at a mean of 1300.
    assert drafted > 0 and stats.lookup_accepted > rows // 4, stats.summary()
    log_term = math.log(2 * 2 * vocab**count / 1e-6)
    worst = 0.0
    for group, prompt in enumerate(prompts):
        exact = first_tokens_probs(target, prompt, sampling, count).flatten()
        counts = torch.zeros(vocab**count)
        for tokens in out.tokens[group * rows:(group + 1) * rows]:
            counts[(tokens[0] * vocab + tokens[1]) * vocab + tokens[2]] += 1
        bound = torch.sqrt(2 * exact * (1 - exact) * log_term / rows) + 2 * log_term / (3 * rows)
        ratio = float(((counts / rows - exact).abs() / bound).max())
        worst = max(worst, ratio)
    print(f"largest |f - p| / bound: {worst:.3f}")
    assert worst <= 1.0


@pytest.mark.parametrize("argv, lookup", [([], True), (["--no-lookup"], False)])
def test_cli_no_lookup_turns_context_drafts_off(argv, lookup, monkeypatch, capsys):
    """``generate --no-lookup`` sets the engine's switch before generating."""
    from types import SimpleNamespace

    from eagle_kernels import cli

    engine = SimpleNamespace(head=object(), prompt_lookup=None)

    class Generator:
        def __init__(self):
            self.engine = engine

        def generate(self, *args, **kwargs):
            raise ValueError("stopped after the settings")

    monkeypatch.setattr("eagle_kernels.runtime.api.from_pretrained",
                        lambda *args, **kwargs: Generator())
    with pytest.raises(SystemExit):
        cli.main(["generate", *argv])
    assert "stopped after the settings" in capsys.readouterr().err
    assert engine.prompt_lookup is lookup


@pytest.mark.parametrize("draft_seconds, pauses", [(100.0, True), (1.0, False)])
def test_drafts_that_lose_to_plain_steps_pause(target, monkeypatch, draft_seconds, pauses):
    """A fake clock: plain steps take 1 s, a drafted step `draft_seconds`. Drafts 100x slower
    produce fewer tokens per second than plain steps and are paused (then tried again); as
    fast as a plain step they always win. Output: the plain greedy tokens either way."""
    from eagle_kernels.runtime import lookup
    from eagle_kernels.runtime.generation import Engine as EngineClass

    now = [0.0]
    monkeypatch.setattr(lookup, "time", type("Clock", (), {"perf_counter": lambda: now[0]}))
    verify, step = lookup.LookupStep._verify, EngineClass._step

    def slow_verify(self, *args):
        now[0] += draft_seconds
        return verify(self, *args)

    def plain_step(self, *args):
        now[0] += 1.0
        return step(self, *args)

    monkeypatch.setattr(lookup.LookupStep, "_verify", slow_verify)
    asked, propose = [0], lookup.ContextIndex.propose

    def counted_propose(self, *args):
        asked[0] += 1
        return propose(self, *args)

    monkeypatch.setattr(lookup.ContextIndex, "propose", counted_propose)
    monkeypatch.setattr(EngineClass, "_step", plain_step)
    prompts = repetitive_prompts(torch.Generator().manual_seed(3))[2:]  # it repeats itself
    reference = Engine(target).generate(prompts, 200, speculative=False)
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=plain_policy(0.0))
    out = engine.generate(prompts, 200)
    assert out.tokens == reference.tokens
    assert (out.stats.lookup_pauses > 0) == pauses, out.stats.summary()
    assert out.stats.lookup_steps >= lookup.LOOKUP_WINDOW
    # a pause skips LOOKUP_PAUSE steps' proposals (the last step of the call is not a step)
    skipped = out.stats.cycles - asked[0]
    assert skipped == (lookup.LOOKUP_PAUSE * out.stats.lookup_pauses if pauses else 0), (
        skipped, out.stats.summary())


def test_steps_with_drafts_are_not_timed_as_cycles_or_steps(target, monkeypatch):
    """The tree budget times plain steps (its reference) and tree cycles; a step that verified
    a context draft is neither, and must not pass for a cheap cycle of the current tree."""
    # a verify as costly as a plain step (a GPU's): the batch of 3 takes context drafts
    policy = AdaptiveTree({SMALL: CycleCost(0.004, 0.01)}, prior_alpha=0.0, step_seconds=0.01)
    timed = {"step": 0, "cycle": 0}
    monkeypatch.setattr(policy, "time_step", lambda *a: timed.__setitem__("step", timed["step"] + 1))
    monkeypatch.setattr(policy, "time_cycle",
                        lambda *a: timed.__setitem__("cycle", timed["cycle"] + 1))
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=policy)
    out = engine.generate(repetitive_prompts(torch.Generator().manual_seed(3)), 40)
    assert out.stats.lookup_steps > 0 and not out.stats.tree_cycles
    assert timed == {"step": out.stats.cycles - out.stats.lookup_steps, "cycle": 0}


@pytest.mark.parametrize("eos_at", [None, 3])
def test_accepted_drafted_tokens_are_the_recorded_ones(target, eos_at):
    """Batch 1: every step records its root's successor plus the drafted tokens it accepted,
    so new tokens = 1 (prefill) + steps + lookup_accepted, also when EOS cuts a chain."""
    prompts = echo_prompts(target)[2:]
    plain = Engine(target).generate(prompts, 40, speculative=False).tokens
    eos = [] if eos_at is None else [plain[0][eos_at]]
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=plain_policy(0.0))
    stats = engine.generate(prompts, 40, eos_token_ids=eos).stats
    assert stats.lookup_accepted > 0
    assert sum(stats.new_tokens) == 1 + stats.cycles + stats.lookup_accepted, stats.summary()


def test_a_row_accepts_no_more_than_its_draft_nor_its_budget(target, monkeypatch):
    """A row's draft leaves room for the chain's own next token within the budget, and a row
    whose draft is shorter than the batch's widest accepts none of its padding (a reply that
    repeats one token would accept it, and run past its budget)."""
    from eagle_kernels.runtime import lookup

    verify, seen = lookup.LookupStep._verify, []

    def checked(self, root, drafts, bonus_u):
        left = (self.call.budgets - self.call.generated).tolist()
        outputs = verify(self, root, drafts, bonus_u)
        for b, draft in enumerate(drafts):
            seen.append((len(draft), left[b], int(outputs[2][b]), int(outputs[3][b])))
        return outputs

    monkeypatch.setattr(lookup.LookupStep, "_verify", checked)
    prompts = repetitive_prompts(torch.Generator().manual_seed(4))  # row 0 ends in one token
    reference = Engine(target).generate(prompts, 40, speculative=False)
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=plain_policy(0.0))
    assert engine.generate(prompts, 40).tokens == reference.tokens
    active = [(n, left, accepted) for n, left, accepted, on in seen if on]
    assert all(accepted <= n <= left - 1 for n, left, accepted in active), active
    assert any(0 < n == left - 1 < 4 for n, left, _ in active)  # the budget capped a draft


def test_cycles_verify_context_drafts_and_keep_the_head_fed(target):
    """A fixed tree on the CPU (eager): cycles whose sequences have a context draft verify it
    instead of the head's tree, and still feed the head the accepted tokens, so the head's
    own cycles keep predicting the right positions: an oracle head (boosted towards the
    reference continuation by the position its cache says it is at) keeps accepting. The
    histogram and tree counts are the head's cycles only."""
    from runtime_helpers import oracle_head

    prompts = echo_prompts(target)[2:]  # (a cycle takes drafts only when every row has one)
    reference = Engine(target).generate(prompts, 40, speculative=False).tokens
    head = oracle_head(target, [p + r for p, r in zip(prompts, reference)])
    out = Engine(target, head, TreeConfig(2, 2, 4)).generate(prompts, 40)
    assert out.tokens == reference
    stats = out.stats
    tree_cycles = stats.cycles - stats.context_cycles
    assert stats.context_cycles == stats.lookup_steps > 0  # no plain steps here
    assert stats.lookup_accepted > 0 and tree_cycles > 0
    assert stats.tree_cycles == {"2/2/4": tree_cycles} and not stats.plain_steps
    # one entry per active row of each of the head's cycles
    assert tree_cycles <= sum(stats.accepted_histogram) <= tree_cycles * len(prompts)
    assert stats.tau > 2.0, stats.summary()  # the head's cycles still accept (oracle)


def test_cycles_with_context_drafts_are_not_shown_to_the_tree_budget(target, monkeypatch):
    """A policy that keeps speculating: it times and observes the head's cycles only (a
    verified context chain would pass for a cheap, well-accepted cycle of its tree)."""
    from runtime_helpers import oracle_head

    policy = AdaptiveTree({SMALL: CycleCost(0.001, 0.002)}, prior_alpha=0.9, step_seconds=0.01)
    seen = {"time_cycle": 0, "observe": 0, "time_step": 0}
    for name in seen:
        def count(*args, name=name):
            seen[name] += 1
        monkeypatch.setattr(policy, name, count)
    prompts = echo_prompts(target)[2:]
    reference = Engine(target).generate(prompts, 40, speculative=False).tokens
    head = oracle_head(target, [p + r for p, r in zip(prompts, reference)])
    out = Engine(target, head, tree_policy=policy).generate(prompts, 40)
    assert out.tokens == reference
    head_cycles = out.stats.cycles - out.stats.context_cycles
    assert out.stats.context_cycles > 0 and head_cycles > 0 and not out.stats.plain_steps
    assert seen == {"time_cycle": head_cycles, "observe": head_cycles, "time_step": 0}


def test_a_cycle_takes_context_drafts_only_when_every_row_has_one():
    """Plain steps take any row's draft (a row without one still gets its token); a cycle
    only all rows' (a row without one would lose its tree's tokens; finished rows aside), and
    only from matches of 3 tokens or more."""
    from types import SimpleNamespace

    from eagle_kernels.runtime.lookup import ContextDrafts

    call = SimpleNamespace(generated=torch.tensor([0, 0, 0]), out=torch.zeros(3, 8),
                           done=torch.tensor([False, False, True]),
                           budgets=torch.tensor([10, 10, 10]))
    context = ContextDrafts(call, [[1, 2, 3, 1, 2], [4, 5, 6], [1, 2, 3, 1, 2]])
    assert context.propose() == [[3, 1], [], []]
    assert context.propose(in_cycle=True) == [[], [], []]
    call.done[1] = True
    assert context.propose(in_cycle=True) == [[], [], []]  # a 2-token match: not in a cycle
    context.index.extend(0, [3, 1, 2])  # ... 1 2 3 1 2: (3, 1, 2) followed by 3 at 3
    assert context.propose(in_cycle=True) == [[3, 1, 2], [], []]


@pytest.mark.parametrize("lookup", [True, False])
def test_the_head_cache_holds_what_a_fresh_prefill_of_the_output_gives(target, monkeypatch,
                                                                       lookup):
    """After a call whose cycles verified context chains (and one whose cycles are all the
    head's), the head's cache holds, bit for bit, the keys and values of one prefill of the
    head over the final sequence: every accepted token was committed once, in order, with its
    own target features (row-invariant cpu kernels make the two ways equal)."""
    from eagle_kernels.runtime.drafting import causal_tree_mask, commit

    head = new_draft_head(EAGLE3, target, seed=2)
    caches, allocate = [], head.allocate_cache
    monkeypatch.setattr(head, "allocate_cache", lambda *a: caches.append(allocate(*a)) or
                        caches[-1])
    prompts = echo_prompts(target)[2:]
    engine = Engine(target, head, TreeConfig(2, 2, 4), prompt_lookup=lookup)
    out = engine.generate(prompts, 40)
    assert (out.stats.context_cycles > 0) == lookup and out.stats.tree_cycles
    [cache] = caches
    n = int(cache.lens[0])
    sequence = torch.tensor([prompts[0] + out.tokens[0]])
    assert n == sequence.shape[1] - 1  # every pair (token t, token t + 1) but the last root
    with torch.inference_mode():
        target_cache = target.allocate_cache(1, n)
        hidden, features = target(sequence[:, :n], torch.arange(n).unsqueeze(0), target_cache,
                                  causal_tree_mask(1, n, sequence.device), head.feature_layers)
        fresh = allocate(1, cache.max_len)
        commit(head, fresh, sequence[:, 1:], head.project(hidden, features), torch.tensor([n]))
    for got, want in zip(cache.all_tensors(), fresh.all_tensors()):
        assert torch.equal(got[:, :n], want[:, :n])


def test_within_drafts_cuts_each_row_to_its_own_draft():
    """A row whose draft was padded to the batch's widest accepts at most its own draft; the
    output tokens up to the cut are kept (the target's argmax after each accepted node)."""
    from eagle_kernels import ops
    from eagle_kernels.runtime.lookup import within_drafts

    result = ops.AcceptResult(
        output_tokens=torch.tensor([[7, 8, 9, 5], [4, 6, -1, -1]]),
        num_accepted=torch.tensor([3, 1], dtype=torch.int32),
        accepted_nodes=torch.tensor([[0, 1, 2, 3], [0, 1, -1, -1]], dtype=torch.int32))
    cut = within_drafts(result, [[7], [4, 6, 2]])
    assert cut.num_accepted.tolist() == [1, 1] and cut.num_accepted.dtype == torch.int32
    assert cut.accepted_nodes.tolist() == [[0, 1, -1, -1], [0, 1, -1, -1]]
    assert torch.equal(cut.output_tokens, result.output_tokens)


def test_a_cycle_row_accepts_none_of_its_padding(target, monkeypatch):
    """Batch 2, both rows with context drafts of different lengths: the shorter one's padding
    can match the target's argmax (here it does, twice, without the cut), and the cycle still
    takes no more than each row's own draft."""
    from eagle_kernels.runtime import lookup

    observed, observe = [], lookup.ContextDrafts.observe

    def watched(self, drafts, new_tokens, counts, accepted):
        if any(drafts):
            observed.append(([len(d) for d in drafts], accepted.tolist()))
        return observe(self, drafts, new_tokens, counts, accepted)

    monkeypatch.setattr(lookup.ContextDrafts, "observe", watched)
    gen = torch.Generator().manual_seed(0)
    bases = [torch.randint(0, 299, (n,), generator=gen).tolist() for n in (6, 9)]
    prompts = [base + base + base[:3] for base in bases]
    reference = Engine(target).generate(prompts, 60, speculative=False).tokens
    engine = Engine(target, new_draft_head(EAGLE3, target, seed=1), TreeConfig(1, 1, 2))
    out = engine.generate(prompts, 60)
    assert out.tokens == reference and out.stats.context_cycles > 0
    assert any(len(set(lengths)) > 1 for lengths, _ in observed)  # padding in some cycle
    assert all(a <= n for lengths, accepted in observed for n, a in zip(lengths, accepted))


def test_a_batch_takes_context_drafts_only_where_verifying_them_is_cheap():
    """A batched step verifies every row's chain: it takes the drafts only where the tree
    budget puts that forward at LOOKUP_BATCH_MAX_VERIFY_STEPS plain steps or less (a GPU), not
    where it costs several (a CPU); one sequence takes them whatever the cost (its own payoff
    check decides), and without a budget every batch does."""
    from types import SimpleNamespace

    from eagle_kernels.runtime.lookup import LOOKUP_BATCH_MAX_VERIFY_STEPS, ContextDrafts

    def drafts(rows: int, steps):
        call = SimpleNamespace(generated=torch.zeros(rows, dtype=torch.int64),
                               out=torch.zeros(rows, 8), done=torch.zeros(rows, dtype=torch.bool),
                               budgets=torch.full((rows,), 10))
        asked = []

        def verify_steps(batch, nodes):
            asked.append((batch, nodes))
            return steps

        context = ContextDrafts(call, [[1, 2, 3, 1, 2]] * rows,
                                verify_steps=None if steps is None else verify_steps)
        return context.propose(), asked

    assert drafts(2, 3.0) == ([[], []], [(2, 3)])  # two chains of [root, 3, 1]
    assert drafts(2, LOOKUP_BATCH_MAX_VERIFY_STEPS) == ([[3, 1], [3, 1]], [(2, 3)])
    assert drafts(1, 3.0) == ([[3, 1]], [])
    assert drafts(2, None)[0] == [[3, 1], [3, 1]]


def test_a_steps_progress_is_what_its_slowest_row_recorded_in_every_row():
    """The payoff check times a step by how far it moved the call: rows that recorded tokens
    times the fewest any recorded (finished rows record none; rows cut short by an EOS do not
    set the pace)."""
    from eagle_kernels.runtime.lookup import call_progress

    assert call_progress([3]) == 3
    assert call_progress([4, 1, 0, 2]) == 3
    assert call_progress([0, 0]) == 0
    # A row an EOS cut short (1 recorded of the 4 it accepted) finishes: it holds nothing back.
    assert call_progress([3, 1], produced=[3, 4]) == 6
    assert call_progress([3, 1], produced=[3, 1]) == 2  # uncut: the slow row sets the pace
    assert call_progress([1, 2], produced=[3, 3]) == 3  # every row cut: what they recorded


def test_the_engine_costs_a_batch_by_its_rows(target):
    """Wired through the engine: with verify costs growing by rows (a CPU's), a tree that pays
    for one sequence runs for one prompt, while a batch of 3 decodes plainly from the start
    and takes no context drafts (one sequence does take them)."""
    costs = {SMALL: CycleCost(0.0005, 0.0075)}  # a forward: 5 ms + 1.25 ms a row
    policy = AdaptiveTree(costs, prior_alpha=0.5, step_seconds=0.00625, online_timing=False)
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=policy)
    prompts = echo_prompts(target)
    batch = engine.generate(prompts, 24)  # first: the random head's misses would teach alpha
    assert not batch.stats.tree_cycles and batch.stats.lookup_steps == 0, batch.stats.summary()
    assert batch.stats.fallback.startswith("plain decoding")
    one = engine.generate(prompts[:1], 24)
    assert one.stats.tree_cycles, one.stats.summary()  # 1.28 steps for tau 1.5: it pays
    policy.prior_alpha, policy.history = 0.0, []  # now plain for one sequence too
    single = engine.generate(prompts[2:], 24)
    assert not single.stats.tree_cycles and single.stats.lookup_steps > 0, single.stats.summary()
