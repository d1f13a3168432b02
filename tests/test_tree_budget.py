"""Tree budget: cycle costs measured as a cycle runs them, the acceptance estimate learned from
the accepted lengths the loop observes, the tree re-picked among fixed shapes, and output that
stays exact whichever trees a call uses."""

from __future__ import annotations

import pytest
import torch

from eagle_kernels.runtime import Engine, TreeConfig
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head
from eagle_kernels.runtime.tree_budget import (CANDIDATE_TREES, TIMINGS_TO_TRUST, AdaptiveTree,
                                               CycleCost, PRIOR_WEIGHT, choose_tree,
                                               expected_tau, fit_alpha, measure_cycle, tree_tau,
                                               trees_that_can_pay)
from runtime_helpers import tiny_target

SMALL, MEDIUM, LARGE = TreeConfig(1, 0, 2), TreeConfig(4, 3, 12), TreeConfig(10, 6, 60)


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=5)


def synthetic_costs() -> dict[TreeConfig, CycleCost]:
    """Verify grows slowly with the node count (a memory-bound device), drafting with depth."""
    return {tree: CycleCost(draft=0.002 * (tree.depth + 1),
                            verify=0.03 + 0.0005 * tree.total_tokens)
            for tree in (SMALL, MEDIUM, LARGE)}


def test_tau_model_and_its_inverse():
    assert expected_tau(1, 0, 0.7, 10) == 1.0
    assert expected_tau(60, 7, 0.7, 10) > expected_tau(16, 3, 0.7, 10) > 1.0
    for tree in (SMALL, MEDIUM, LARGE):
        for alpha in (0.05, 0.3, 0.8):
            assert fit_alpha([(tree, tree_tau(tree, alpha))]) == pytest.approx(alpha, abs=1e-6)


def test_acceptance_fit_matches_the_tokens_the_trees_produced():
    """The fitted alpha makes the trees that ran expect exactly the tokens they produced (a
    mean of per-cycle inverses would sit well below: 0.30 here, expecting 1.38 tokens, not 1.49)."""
    chain = TreeConfig(2, 1, 3)
    cycles = [(chain, 1)] * 56 + [(chain, 2)] * 39 + [(chain, 3)] * 5
    assert tree_tau(chain, fit_alpha(cycles)) == pytest.approx(1.49, abs=1e-6)
    mixed = cycles + [(MEDIUM, 4)] * 10
    alpha = fit_alpha(mixed)
    expected = 100 * tree_tau(chain, alpha) + 10 * tree_tau(MEDIUM, alpha)
    assert expected == pytest.approx(149 + 40, abs=1e-4)
    policy = AdaptiveTree(synthetic_costs(), prior_alpha=0.5)
    for _ in range(4):
        policy.observe(chain, [0, 1, 0, 2])  # 4 cycles x 4 sequences: 16 of MEMORY
    seen = fit_alpha([(chain, n + 1) for n in [0, 1, 0, 2] * 4])
    assert policy.alpha() == pytest.approx((0.5 * PRIOR_WEIGHT + seen * 16) / (PRIOR_WEIGHT + 16))


def test_weak_acceptance_picks_small_trees_and_strong_acceptance_large_ones():
    policy = AdaptiveTree(synthetic_costs(), prior_alpha=0.5)
    for _ in range(40):  # the head accepts nothing: cheapest cycle wins
        policy.observe(policy.current, [0])
    assert policy.current == SMALL and policy.alpha() < 0.2
    for _ in range(80):  # now every draft is accepted: deeper trees pay for themselves
        policy.observe(policy.current, [policy.current.max_depth])
    assert policy.current in (MEDIUM, LARGE) and policy.alpha() > 0.9
    assert "adapted online" in policy.report()


def test_measured_cycle_costs_cover_drafting_and_verify(target):
    head = new_draft_head(EAGLE3, target)
    cost = measure_cycle(target, head, MEDIUM, context=16, repeats=1)
    assert cost.draft > 0 and cost.verify > 0
    policy = choose_tree(target, head, context=16, repeats=1, trees=CANDIDATE_TREES[:3],
                         prune=False)
    assert policy.current in CANDIDATE_TREES[:3] and set(policy.costs) == set(CANDIDATE_TREES[:3])
    pruned = choose_tree(target, head, context=16, repeats=1, trees=CANDIDATE_TREES[:3])
    assert pruned.trees[0] == CANDIDATE_TREES[0] and set(pruned.trees) <= set(CANDIDATE_TREES[:3])


def test_cycle_costs_are_timed_with_value_checks_off_as_the_loop_runs(target, monkeypatch):
    """Both timings of a cycle (measure_cycle, measure_trees) run their calls as the generation
    loop does, with content scans off: scans in a timing would price a tree by its checks."""
    from eagle_kernels.ops import value_checks_enabled
    from eagle_kernels.runtime import tree_budget

    seen = []
    real = tree_budget.cycle_calls

    def recording(*args):
        return [lambda call=call: (seen.append(value_checks_enabled()), call())[1]
                for call in real(*args)]

    monkeypatch.setattr(tree_budget, "cycle_calls", recording)
    head = new_draft_head(EAGLE3, target)
    measure_cycle(target, head, MEDIUM, context=16, repeats=1)
    tree_budget.measure_trees(target, head, trees=[MEDIUM], context=16, repeats=1)
    assert seen and not any(seen)


def test_start_up_step_is_timed_in_a_row_of_steps(target, monkeypatch):
    """Every round of the start-up timing runs plain steps untimed first, then the timed step,
    then the trees' calls (a step timed right after the largest tree's verify cost ~1.4x what
    steps in a row cost: see SETTLE_SECONDS); each tree gets its own drafting and verify times
    and the step its own (calls timed 1, 2, 3, ... s in the order they are made)."""
    from eagle_kernels.runtime import tree_budget

    order = []
    monkeypatch.setattr(tree_budget, "SETTLE_SECONDS", 0.0)  # one untimed step a round
    monkeypatch.setattr(tree_budget, "_step_call", lambda *args: lambda: order.append("step"))
    monkeypatch.setattr(tree_budget, "cycle_calls", lambda target, head, tree, *args: [
        lambda: order.append(("draft", tree)), lambda: order.append(("verify", tree))])
    real_times = tree_budget.interleaved_times

    def times(calls, repeats, device, settle=None):
        real_times(calls, repeats, device, settle)  # runs the calls: records their order
        return [[float(index + 1)] * repeats for index in range(len(calls))]

    monkeypatch.setattr(tree_budget, "interleaved_times", times)
    head = new_draft_head(EAGLE3, target)
    trees = [SMALL, MEDIUM]
    costs, step = tree_budget.measure_trees(target, head, trees=trees, context=16, repeats=2)
    cycle = [("draft", SMALL), ("verify", SMALL), ("draft", MEDIUM), ("verify", MEDIUM)]
    assert order == ["step", *cycle] + (["step", "step", *cycle] * 2)
    assert step == 1.0
    assert costs == {SMALL: CycleCost(2.0, 3.0), MEDIUM: CycleCost(4.0, 5.0)}


def test_trees_that_cannot_pay_are_not_measured_further():
    """A tree whose cycle costs more plain steps than the most tokens it can yield (max_depth
    + 1) is dropped; one costing exactly that many is kept, and so is the first tree, which the
    policy needs even when nothing pays."""
    step = 0.01
    chain, bushy = TreeConfig(1, 1, 2), TreeConfig(2, 2, 4)  # at most 2 and 4 tokens a cycle
    costs = {chain: CycleCost(0.005, 0.02), bushy: CycleCost(0.01, 0.02), LARGE: CycleCost(
        0.01, (LARGE.max_depth + 1) * step)}
    assert trees_that_can_pay(costs, step) == [chain, bushy]  # LARGE: 0.01 s over its 8 steps
    costs[LARGE] = CycleCost(0.0, (LARGE.max_depth + 1) * step)
    assert trees_that_can_pay(costs, step) == [chain, bushy, LARGE]
    costs[bushy] = CycleCost(0.0, 4.001 * step)
    assert trees_that_can_pay(costs, step) == [chain, LARGE]
    costs[chain] = CycleCost(0.0, 2.001 * step)
    assert trees_that_can_pay(costs, step) == [chain, LARGE]  # the first stays


def test_first_cycles_pair_with_the_start_up_plain_step(target):
    """Cycles timed right after choose_tree are costed in its plain step: a call that starts at
    once (make demo) can see that its cycles cost more plain steps than drafting plus verify."""
    from eagle_kernels.runtime.tree_budget import TIMINGS_TO_TRUST

    head = new_draft_head(EAGLE3, target)
    policy = choose_tree(target, head, context=16, repeats=1, trees=CANDIDATE_TREES[:2])
    tree, step = policy.current, policy.step_seconds
    assert policy.steps_per_cycle(tree) is None  # no cycle timed yet
    for _ in range(TIMINGS_TO_TRUST):
        policy.time_cycle(tree, 3 * step, batch=1)
    assert policy.steps_per_cycle(tree) == pytest.approx(3.0)


def test_adaptive_trees_stay_exact(target):
    """A call that switches tree shapes between cycles still emits the autoregressive tokens:
    an optimistic prior picks a branching tree, the random head's misses shrink it.

    Deterministic (fixed target, head and prompts; false-failure probability 0): on a random
    prompt the switch is only likely (the big tree stays if the random head accepts ~3 tokens a
    cycle, as on a reply that repeats one token the head happens to predict)."""
    fixed = torch.Generator().manual_seed(20261128)
    prompts = [torch.randint(0, 300, (n,), generator=fixed).tolist() for n in (7, 12)]
    reference = Engine(target).generate(prompts, 24, speculative=False)
    big = TreeConfig(4, 3, 16)
    costs = {SMALL: CycleCost(0.001, 0.009), big: CycleCost(0.002, 0.02)}
    policy = AdaptiveTree(costs, prior_alpha=0.97, online_timing=False)
    assert policy.current == big
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=policy)
    out = engine.generate(prompts, 24)
    assert out.tokens == reference.tokens
    assert set(out.stats.tree_cycles) == {"4/3/16", "1/0/2"}, out.stats.tree_cycles
    assert policy.current == SMALL and policy.history


def test_plain_decoding_takes_over_when_no_tree_pays(target):
    """A weak head on a device where verify costs more than a step: the call switches to plain
    decoding mid-way (same tokens), later calls decode plainly, every PROBE_EVERY-th speculates.

    Deterministic (false-failure probability 0): the target, the head (seed 0) and the prompt
    (its own fixed seed) are fixed. Drawn from the run's seed, the prompt was a chance: a reply
    on which the random head happens to accept enough never makes the call switch within 24
    tokens (none in 25 seeds with context drafts off; 4 in 60 with them on)."""
    from eagle_kernels.runtime.tree_budget import PROBE_EVERY

    fixed = torch.Generator().manual_seed(20261127)
    prompts = [torch.randint(0, 300, (n,), generator=fixed).tolist() for n in (9,)]
    reference = Engine(target).generate(prompts, 24, speculative=False)
    policy = AdaptiveTree({SMALL: CycleCost(0.002, 0.012)}, prior_alpha=0.9, step_seconds=0.01,
                          online_timing=False)
    assert policy.worth_speculating()  # optimistic prior: 1.9 tokens per 14 ms beats 1 per 10
    # Context drafts off for the first call: a reply that repeats itself would otherwise have
    # its cycles verify context chains, which the tree budget does not observe, and the call
    # could end before the head's misses make it switch (4 prompts in 60 did).
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=policy,
                    prompt_lookup=False)
    out = engine.generate(prompts, 24)
    assert out.tokens == reference.tokens
    assert out.stats.plain_steps > 0 and "plain decoding from cycle" in out.stats.fallback
    engine.prompt_lookup = True
    assert not policy.worth_speculating() and "faster than any tree" in policy.report()
    later = [engine.generate(prompts, 24) for _ in range(2 * PROBE_EVERY)]
    assert all(out.tokens == reference.tokens for out in later)
    speculated = [out for out in later if out.stats.tree_cycles]  # the probes
    assert len(speculated) == 2, [out.stats.fallback for out in later]
    assert all(out.stats.mode == "speculative" and out.stats.plain_steps == out.stats.cycles
               and "plain decoding with context drafts" in out.stats.fallback
               for out in later if not out.stats.tree_cycles)


def test_relative_medians_take_each_ratio_within_one_round(monkeypatch):
    """Costs relative to a reference call are medians of per-round ratios, so rounds at
    different speeds (here 1x to 2x, one round slower for the reference alone) leave the ratio
    at 0.8; medians of whole runs pick different rounds for the two calls and give 0.774."""
    from eagle_kernels.runtime import tree_budget

    times = [[0.8, 1.28, 1.2, 1.16, 1.6],  # costs 0.8 of the reference at speeds 1 .. 2
             [1.0, 1.6, 1.5, 1.55, 2.0]]   # the reference (round 4: 1.55, not 1.45)
    monkeypatch.setattr(tree_budget, "interleaved_times",
                        lambda calls, repeats, device, settle=None: times)
    call, reference = tree_budget.relative_medians([None, None], 5, torch.device("cpu"), 1)
    assert reference == 1.55 and call / reference == pytest.approx(0.8, rel=1e-12)
    call, reference = tree_budget.interleaved_medians([None, None], 5, torch.device("cpu"))
    assert call / reference == pytest.approx(1.2 / 1.55, rel=1e-12)


def test_timed_cycles_and_steps_replace_the_start_up_costs():
    """Start-up put a 3-node cycle at 1.45 plain steps (no tree pays at alpha 0.35); the loop
    then times steps at 20 ms and cycles at 23 ms (1.15 steps): speculation pays, and an untimed
    tree's cost follows the timed one's ratio to its start-up cost. Timings of another batch
    size are not mixed in."""
    chain, bigger = TreeConfig(2, 1, 3), TreeConfig(4, 3, 8)
    costs = {chain: CycleCost(0.002, 0.0125), bigger: CycleCost(0.004, 0.025)}
    policy = AdaptiveTree(costs, prior_alpha=0.35, step_seconds=0.01)
    assert not policy.start_call() and policy.plain_step_seconds() == 0.01
    for _ in range(TIMINGS_TO_TRUST):
        policy.time_step(0.02, batch=1)
        policy.time_cycle(chain, 0.023, batch=1)
        policy.time_cycle(chain, 0.001, batch=4)  # another batch size: ignored
        policy.time_step(0.001, batch=4)
    assert policy.plain_step_seconds() == pytest.approx(0.02)
    assert policy.cycle_seconds(chain) == pytest.approx(0.023) and policy.timed(chain)
    assert policy.cycle_seconds(bigger) == pytest.approx(0.029 * 0.023 / 0.0145)
    assert policy.start_call() and policy.current == chain
    report = policy.report()
    assert "timed 23.0 ms a cycle" in report and "plain decoding step 20.0" in report


def test_timings_expire_and_a_tree_timed_once_does_not_set_the_scale():
    """Timings older than TIMING_MAX_AGE no longer count (the machine's speed has moved since);
    one timing of another tree does not replace the scale the trusted tree gives; without a
    measured step the policy never decodes plainly, whatever steps it times."""
    from eagle_kernels.runtime.tree_budget import TIMING_MAX_AGE

    now = [100.0]
    chain, bigger = TreeConfig(2, 1, 3), TreeConfig(4, 3, 8)
    costs = {chain: CycleCost(0.002, 0.0125), bigger: CycleCost(0.004, 0.025)}
    policy = AdaptiveTree(costs, prior_alpha=0.35, step_seconds=0.01, clock=lambda: now[0])
    for _ in range(TIMINGS_TO_TRUST):
        policy.time_cycle(chain, 0.029, batch=1)  # twice its start-up cost
    policy.time_cycle(bigger, 0.001, batch=1)  # one (absurd) timing: not trusted
    assert not policy.timed(bigger)
    assert policy.cycle_seconds(bigger) == pytest.approx(0.058)  # 2x start-up, from chain
    assert policy.plain_step_seconds() == pytest.approx(0.02)
    now[0] += TIMING_MAX_AGE + 1
    assert not policy.timed(chain) and policy.cycle_seconds(chain) == pytest.approx(0.0145)
    blind = AdaptiveTree(costs, prior_alpha=0.01)
    for _ in range(TIMINGS_TO_TRUST):
        blind.time_step(0.001, batch=1)
    assert blind.plain_step_seconds() is None and blind.worth_speculating()


def test_a_call_that_speculates_sees_a_few_cycles_before_it_may_fall_back():
    policy = AdaptiveTree(synthetic_costs(), prior_alpha=0.5, step_seconds=1.0)
    for _ in range(3):
        policy.observe(policy.current, [0])
    assert not policy.just_repicked
    assert policy.start_call() and policy.just_repicked  # the count starts with the call


def test_the_loop_times_its_cycles_and_steps(target, gen):
    """A call with the policy feeds it the wall clock of each cycle, and a plain call of each
    step (both at the policy's batch size)."""
    prompt = [torch.randint(0, 300, (9,), generator=gen).tolist()]
    policy = AdaptiveTree({SMALL: CycleCost(0.002, 0.012)}, prior_alpha=0.9, step_seconds=0.01)
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=policy)
    engine.generate(prompt, 12, speculative=False)
    steps = [seconds for _, seconds in policy._step_timings]
    assert len(steps) >= TIMINGS_TO_TRUST
    assert policy.plain_step_seconds() == sorted(steps)[len(steps) // 2]
    out = engine.generate(prompt, 12)
    cycles = out.stats.tree_cycles.get("1/0/2", 0)
    assert len(policy._cycle_timings.get(SMALL, ())) == min(cycles, 16) > 0


def test_a_cycle_is_compared_with_plain_steps_of_its_own_moment():
    """Cycles timed next to slow plain steps (23.4 vs 20 ms: 1.17 steps), then, from 5 s
    later, 40 s of fast plain steps (14 ms): the cycle costs 1.17 steps of now, 16.4 ms, and
    speculation pays at alpha 0.35 (tau 1.47); its raw 23.4 ms against 14 ms would not. The
    slow steps are long out of the recent-step window; their samples still pair."""
    now = [0.0]
    chain = TreeConfig(2, 1, 3)
    policy = AdaptiveTree({chain: CycleCost(0.002, 0.0125)}, prior_alpha=0.35,
                          step_seconds=0.01, clock=lambda: now[0])
    for _ in range(40):  # slow phase: 2 s of plain steps, then cycles right after
        now[0] += 0.05
        policy.time_step(0.020, batch=1)
    for _ in range(TIMINGS_TO_TRUST):
        now[0] += 0.03
        policy.time_cycle(chain, 0.0234, batch=1)
    now[0] += 5.0
    for _ in range(2000):  # fast phase: 40 s of plain steps
        now[0] += 0.02
        policy.time_step(0.014, batch=1)
    assert policy.steps_per_cycle(chain) == pytest.approx(1.17)
    assert policy.cycle_seconds(chain) == pytest.approx(1.17 * 0.014)
    assert policy.start_call() and "= 1.17 plain steps" in policy.report()
    unpaired = 0.0234 / 0.014
    assert tree_tau(chain, 0.35) / unpaired < 1.02  # what the raw timings would have said


def test_nearest_steps_stay_within_the_pairing_distance():
    from eagle_kernels.runtime.tree_budget import _nearest

    times = [1.0, 2.0, 3.0, 10.0, 30.0]
    assert _nearest([], 5.0, 5, 10.0) == []
    assert sorted(_nearest(times, 2.4, 2, 10.0)) == [1, 2]
    assert sorted(_nearest(times, 2.4, 9, 10.0)) == [0, 1, 2, 3]  # 30.0 is too far
    assert _nearest(times, 50.0, 3, 10.0) == []
    assert _nearest(times, 0.0, 1, 10.0) == [0]
    assert _nearest([1.0, 3.0], 2.0, 1, 1.0) == [0]  # a tie goes to the earlier, inclusive
    assert _nearest([1.0, 3.0], 2.0, 5, 0.5) == []
    assert sorted(_nearest(times, 2.4, 9, float("inf"))) == [0, 1, 2, 3, 4]  # stops when out


def test_trees_without_pairs_follow_the_paired_tree():
    """A paired tree (1.17 steps) sets the costs of the others: a tree timed only far from
    plain steps by its timings against the paired tree's, an untimed one by start-up costs;
    pairs expire with their timings."""
    from eagle_kernels.runtime.tree_budget import TIMING_MAX_AGE

    now = [0.0]
    chain, bigger, other = TreeConfig(2, 1, 3), TreeConfig(4, 3, 8), TreeConfig(2, 2, 4)
    costs = {chain: CycleCost(0.002, 0.0125), bigger: CycleCost(0.004, 0.025),
             other: CycleCost(0.003, 0.015)}
    policy = AdaptiveTree(costs, prior_alpha=0.35, step_seconds=0.01, clock=lambda: now[0])
    for _ in range(TIMINGS_TO_TRUST):
        now[0] += 0.1
        policy.time_step(0.020, batch=1)
        policy.time_cycle(chain, 0.0234, batch=1)
    now[0] += 20.0  # far from every plain step
    for _ in range(TIMINGS_TO_TRUST):
        policy.time_cycle(bigger, 0.0468, batch=1)
    assert policy.steps_per_cycle(chain) == pytest.approx(1.17)
    assert policy.steps_per_cycle(bigger) == pytest.approx(2 * 1.17)  # twice chain's timing
    assert policy.steps_per_cycle(other) == pytest.approx(0.018 / 0.0145 * 1.17)
    now[0] += TIMING_MAX_AGE
    assert policy.steps_per_cycle(chain) is None


def cpu_like_policy() -> AdaptiveTree:
    """Start-up costs of a compute-bound device at batch 1: a forward costs 4 ms + 2 ms a row
    (a plain step 6 ms), drafting 0.5 ms; the head accepts half its drafts."""
    costs = {tree: CycleCost(0.0005, 0.004 + 0.002 * tree.total_tokens)
             for tree in CANDIDATE_TREES[:5]}
    return AdaptiveTree(costs, prior_alpha=0.5, step_seconds=0.006, online_timing=False)


def test_a_call_at_another_batch_is_costed_by_its_rows():
    """The start-up measurement is at one batch; a call of B sequences costs its plain step as
    a forward over B rows and a cycle as one over B x nodes rows, interpolated between the
    measured forwards (linear past the largest). Compute-bound (cost grows with rows): a tree
    that pays for one sequence does not for 8; memory-bound (flat): it pays at both."""
    policy = cpu_like_policy()
    assert policy.verify_steps(1, 2) == pytest.approx(0.008 / 0.006)
    assert policy.verify_steps(8, 2) == pytest.approx(0.036 / 0.020)  # 16 rows: extrapolated
    assert policy.verify_steps(3, 1) == 1.0
    assert policy.start_call(1) and policy.current == TreeConfig(1, 1, 2)
    assert not policy.start_call(8)  # 1.8 steps + drafting for tau 1.5
    assert policy.plain_step_seconds() == pytest.approx(0.020)  # 8 rows
    assert policy.start_call(1) and policy.plain_step_seconds() == pytest.approx(0.006)
    flat = AdaptiveTree({tree: CycleCost(0.0005, 0.006) for tree in CANDIDATE_TREES[:5]},
                        prior_alpha=0.5, step_seconds=0.006, online_timing=False)
    assert flat.start_call(8) and flat.verify_steps(8, 8) == 1.0


def test_forward_costs_by_rows_rise_and_extend_at_the_overall_slope():
    """_rows_seconds: exact at the measured forwards, linear between them, the first below,
    made non-decreasing (a 12-node verify timed below the 8-node one costs as much as it), and
    past the largest extended at the first-to-largest slope, not the last segment's: never
    falling, never negative."""
    policy = cpu_like_policy()  # 1 row 6 ms, 2 8 ms, 3 10, 4 12, 6 16, 8 20
    assert policy._rows_seconds(3) == pytest.approx(0.010)
    assert policy._rows_seconds(5) == pytest.approx(0.014)
    assert policy._rows_seconds(0) == pytest.approx(0.006)
    noisy = dict(policy.costs)
    noisy[TreeConfig(4, 3, 12)] = CycleCost(0.0005, 0.019)  # below 8 nodes' 20 ms
    bent = AdaptiveTree(noisy, prior_alpha=0.5, step_seconds=0.006, online_timing=False)
    assert bent._rows_seconds(12) == pytest.approx(0.020)
    slope = (0.020 - 0.006) / 11
    assert bent._rows_seconds(100) == pytest.approx(0.020 + slope * 88)
    rows = [bent._rows_seconds(n) for n in range(0, 400)]
    assert all(b >= a > 0 for a, b in zip(rows, rows[1:]))
    assert bent.verify_steps(4, 5) >= bent.verify_steps(4, 2) >= 1.0
    assert AdaptiveTree(noisy, step_seconds=0.0).verify_steps(4, 2) is None


def test_choose_tree_measures_again_only_the_trees_that_can_pay(target, monkeypatch):
    """A one-round pilot over every candidate, then the full measurement over the trees that
    can pay there: the policy holds exactly those."""
    from eagle_kernels.runtime import tree_budget

    trees = CANDIDATE_TREES[:4]
    scripted = {tree: CycleCost(0.0, 0.006 * (tree.max_depth + 1) * (1.5 if i == 2 else 0.9))
                for i, tree in enumerate(trees)}  # the third costs 1.5x the most it yields
    asked = []

    def measure(target_, head_, candidates, batch, context, repeats):
        asked.append((list(candidates), repeats))
        return {tree: scripted[tree] for tree in candidates}, 0.006

    monkeypatch.setattr(tree_budget, "measure_trees", measure)
    policy = choose_tree(target, None, trees=trees, repeats=5)
    kept = [trees[0], trees[1], trees[3]]
    assert asked == [(list(trees), 1), (kept, 5)] and policy.trees == kept


def test_no_probe_where_no_tree_could_pay_even_at_a_high_alpha():
    """A probe call speculates to re-learn acceptance; where no tree would pay even at
    PROBE_ALPHA (here a batch of 8 on a compute-bound device: a forward costs 2 ms + 2 ms a row,
    so a 1/1/2 cycle costs 1.9 plain steps of 8 rows), it would only lose time: no call
    speculates. At batch 1 (a cycle 1.6 steps) the probes go on, the first at once."""
    from eagle_kernels.runtime.tree_budget import PROBE_EVERY

    chain = TreeConfig(1, 1, 2)
    policy = AdaptiveTree({chain: CycleCost(0.0005, 0.006)}, prior_alpha=0.5,
                          step_seconds=0.004, online_timing=False)
    assert not any(policy.start_call(8) for _ in range(3 * PROBE_EVERY))
    assert not policy.could_pay() and policy.call_batch == 8
    assert policy.start_call(1) and policy.could_pay()  # overdue: probes at once
    calls = [policy.start_call(1) for _ in range(2 * PROBE_EVERY)]
    assert calls.count(True) == 2 and not policy.worth_speculating()


def _paired_then_aged_policy(clock) -> AdaptiveTree:
    """SMALL timed beside plain steps at t = 0-0.2 (paired: a ratio), MEDIUM alone at t = 50
    (trusted, unpaired: costed relative to SMALL while SMALL's ratio counts)."""
    now = [0.0]
    policy = AdaptiveTree(synthetic_costs(), step_seconds=0.01, clock=lambda: now[0])
    for when in (0.0, 0.1, 0.2):
        now[0] = when
        policy.time_step(0.01, batch=1)
        policy.time_cycle(SMALL, 0.015, batch=1)
    for when in (50.0, 50.1, 50.2):
        now[0] = when
        policy.time_cycle(MEDIUM, 0.03, batch=1)
    policy.clock = clock
    return policy


def test_paired_ratios_expire_within_the_second_they_age_out():
    """Regression: the paired-ratio memo was keyed on the whole second, so at t = 60.5 it still
    listed SMALL (memoised at 60.0), whose timings had aged past TIMING_MAX_AGE: costing MEDIUM
    against it divided by None (TypeError mid-generation)."""
    now = [60.0]
    policy = _paired_then_aged_policy(lambda: now[0])
    assert policy.steps_per_cycle(MEDIUM) == pytest.approx(3.0)  # (30 / 15 ms) x 1.5 steps
    now[0] = 60.5
    assert policy.steps_per_cycle(MEDIUM) is None  # SMALL's pairs have aged out
    assert policy.cycle_seconds(MEDIUM) == pytest.approx(0.03)  # MEDIUM's own timings
    now[0] = 60.0  # a clock that goes back recomputes too (scripted clocks in tests do)
    assert policy.steps_per_cycle(MEDIUM) == pytest.approx(3.0)


def test_a_reference_tree_aging_out_mid_estimate_falls_back_to_start_up_costs():
    """The clock moves between the paired ratios and the reference tree's own timings (its
    timings age out in between): the estimate scales by start-up costs instead of failing."""
    readings = iter([60.0, 60.0])
    policy = _paired_then_aged_policy(lambda: next(readings, 60.5))
    costs = synthetic_costs()
    expected = costs[MEDIUM].total / costs[SMALL].total * 1.5
    assert policy.steps_per_cycle(MEDIUM) == pytest.approx(expected)
