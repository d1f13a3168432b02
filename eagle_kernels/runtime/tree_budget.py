"""Hardware- and head-aware tree budget: which draft tree a cycle should use, from measurements.

The best tree maximises expected tokens per second,

    rate(tree) = tau(tree, alpha) / cycle_seconds(tree),

where ``cycle_seconds`` is what one cycle with that tree really costs on this device (drafting:
head forwards + top-k + expand + rerank; verify: the target over the tree's nodes with its real
packed mask; measured here, :func:`measure_cycle`) and ``tau`` is the expected number of tokens
a cycle produces with a head whose per-token acceptance is ``alpha``. A verify pass over N nodes
costs about one decode step where the device is memory-bound (a GPU at batch 1) and grows with
N where it is compute-bound (a CPU), so the best tree differs per device, and per head.

``alpha`` is not assumed: :class:`AdaptiveTree` starts from a weak prior and updates it from the
accepted lengths the generation loop observes, re-picking among a fixed set of tree shapes
(:data:`CANDIDATE_TREES`) as acceptance turns out better or worse. Only the shapes change, never
what is emitted: every tree is verified by the target, so output stays exact.

Nor are the costs fixed at start-up: the loop times every cycle and every plain step it runs
(wall clock, host sync included) and the policy prefers those timings, recent ones only, to its
start-up measurement. A start-up measurement is a few seconds of one moment on a machine whose
speed drifts (this project's 2-core VM switches between ~35 and ~60 GB/s within minutes, and a
verify's cost relative to a step moves with it), and it leaves out what a cycle does besides
drafting and verifying (acceptance, KV compaction, the head's commit, the loop itself).

``tau`` model (a heuristic of a dynamic EAGLE-2 tree): a tree of N nodes over ``depth + 1``
levels holds ``w = (N - 1) / (depth + 1)`` nodes per level, of which about ``sqrt(w)`` hang under
the path the target takes; each extra sibling there removes a quarter of the remaining miss
probability, and levels accept independently. With alpha 0.7 this gives tau ~ 4.4 for
EAGLE-2's 60 nodes / depth 7, in line with published EAGLE-2 numbers.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field
from statistics import median_high as _median  # sorted(values)[len(values) // 2]
from typing import Callable

import torch

from ..ops._validate import no_value_checks
from ..ops._validate import weights_unchanged
from .drafting import TreeConfig, draft_tree

# The shapes a CPU or GPU may pick from: chains and small trees (compute-bound devices, weak
# heads) up to EAGLE-2's default (memory-bound devices, strong heads). (top_k, depth, nodes).
CANDIDATE_TREES = tuple(TreeConfig(*shape) for shape in (
    (1, 1, 2), (2, 1, 3), (2, 2, 4), (3, 2, 6), (4, 3, 8), (4, 3, 12), (6, 4, 16),
    (8, 5, 24), (8, 5, 32), (10, 6, 48), (10, 6, 60)))
PRIOR_ALPHA = 0.5  # before any observation: a mediocre head
PRIOR_WEIGHT = 8  # cycles' worth of evidence the prior counts for
REPICK_EVERY = 4  # cycles between re-picks
PROBE_EVERY = 4  # calls: a call speculates at least this often, to keep learning acceptance
PROBE_ALPHA = 0.9  # ... where some tree would pay at this acceptance (better than heads show)
GAIN_TO_SPECULATE = 1.02  # expected rate over plain decoding's below which a call decodes plainly
MEMORY = 64  # cycles of history the estimate keeps (acceptance drifts along a reply)
TIMING_WINDOW = 16  # recent wall-clock timings kept per tree and for the plain step
TIMINGS_TO_TRUST = 3  # timings of a tree (or of the step) before they replace start-up costs
TIMING_MAX_AGE = 60.0  # seconds a timing counts for (this VM's speed changes within minutes)
PAIR_SECONDS = 10.0  # a cycle and plain steps timed this close together saw one machine state
PAIR_STEPS = 5  # a cycle timing is compared with the median of this many steps nearest in time
STEP_SAMPLE_SECONDS = 0.25  # plain steps kept for pairing: one per this many seconds ...
STEP_SAMPLES = 256  # ... this many of them (at least a minute of plain decoding)
# Start-up timing (measure_trees) runs plain steps untimed this long before each round's timed
# step. On a 2-core VM a step right after a 6/4/16 cycle cost 6.7 ms where steps in a row cost
# 4.7 ms, and came back over ~15-18 steps (~80-90 ms; after a 1/1/2 cycle there was no such lag:
# bench/results/2026-11-29d_cpu-2core/steps_after_a_cycle.txt): a step timed right after the
# largest tree's verify made every cycle look cheaper in plain steps than the loop finds it.
SETTLE_SECONDS = 0.1


def expected_tau(nodes: int, depth: int, alpha: float, top_k: int) -> float:
    """Expected tokens per cycle (accepted + bonus) of a tree, under the model above."""
    levels = min(depth + 1, nodes - 1)
    if levels <= 0:
        return 1.0
    per_level = (nodes - 1) / levels
    siblings = min(per_level ** 0.5, top_k)
    level_accept = 1.0 - (1.0 - alpha) * 0.75 ** (siblings - 1.0)
    return sum(level_accept ** level for level in range(levels + 1))


def tree_tau(tree: TreeConfig, alpha: float) -> float:
    return expected_tau(tree.total_tokens, tree.depth, alpha, tree.top_k)


def fit_alpha(cycles: list[tuple[TreeConfig, float]]) -> float:
    """The alpha in [0.01, 0.99] under which ``cycles`` ((tree, tokens produced) pairs) were
    expected to produce the tokens they did (bisection: tree_tau grows with alpha)."""
    runs: dict[TreeConfig, int] = {}
    for tree, _ in cycles:
        runs[tree] = runs.get(tree, 0) + 1
    produced = sum(tokens for _, tokens in cycles)
    low, high = 0.01, 0.99
    for _ in range(30):
        middle = (low + high) / 2
        if sum(count * tree_tau(tree, middle) for tree, count in runs.items()) < produced:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass
class CycleCost:
    """Seconds of one cycle with a tree: drafting (head + top-k + expand + rerank), verify."""

    draft: float
    verify: float

    @property
    def total(self) -> float:
        return self.draft + self.verify


def interleaved_times(calls: list, repeats: int, device: torch.device,
                      settle: Callable[[], None] | None = None) -> list[list[float]]:
    """Seconds of each call in each of ``repeats`` rounds (every call once per round, after one
    warm-up each); ``settle``, where given, runs untimed at the start of every round."""
    for fn in calls:
        fn()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        if settle is not None:
            settle()
        for fn, spent in zip(calls, times):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            spent.append(time.perf_counter() - start)
    return times


def _nearest(times: list[float], when: float, count: int, within: float) -> list[int]:
    """Indices of the (at most) ``count`` entries of sorted ``times`` nearest to ``when``, all
    within ``within`` of it."""
    right = bisect.bisect_left(times, when)
    left, picked = right - 1, []
    while len(picked) < count and (left >= 0 or right < len(times)):
        before = when - times[left] if left >= 0 else float("inf")
        after = times[right] - when if right < len(times) else float("inf")
        if min(before, after) > within:
            break
        if before <= after:
            picked.append(left)
            left -= 1
        else:
            picked.append(right)
            right += 1
    return picked


def interleaved_medians(calls: list, repeats: int, device: torch.device) -> list[float]:
    """Median seconds of each call, timed in rounds (:func:`interleaved_times`): when this
    machine's speed drifts while measuring (shared VMs: 20-40 % within a minute), every call
    sees the drift alike, so their ratios, which is what the tree choice uses, stay right
    instead of favouring whichever was timed in a fast phase."""
    return [_median(spent) for spent in interleaved_times(calls, repeats, device)]


def relative_medians(calls: list, repeats: int, device: torch.device, reference: int,
                     settle: Callable[[], None] | None = None) -> list[float]:
    """Seconds of each call as (median over rounds of its time / ``calls[reference]``'s time in
    the same round) x the reference's median: each ratio is taken within one round, so a speed
    change between rounds (this VM's memory bandwidth moves ~2x within minutes) moves no ratio.
    Medians of whole runs, as :func:`interleaved_medians` takes them, once put a 3-node cycle
    at 1.31 plain steps where repeated measurements gave 1.17."""
    times = interleaved_times(calls, repeats, device, settle)
    base = times[reference]
    scale = _median(base)
    return [_median([t / b for t, b in zip(spent, base)]) * scale for spent in times]


def cycle_calls(target, head, tree: TreeConfig, context: int, batch: int):
    """The two calls a cycle of ``tree`` makes, ready to time (inside inference_mode): the
    head's drafting over its cache, then the target over the drafted tokens with the tree's
    own packed mask and positions, over ``context`` committed tokens."""
    device = target.device
    cache = target.allocate_cache(batch, context + tree.total_tokens)
    draft_cache = head.allocate_cache(batch, context + tree.drafted_keys + 1)
    cache.lens.fill_(context)
    draft_cache.lens.fill_(context)
    root = torch.zeros(batch, dtype=torch.int64, device=device)
    root_hidden = torch.zeros(batch, head.config.hidden_size, dtype=target.dtype, device=device)
    drafted = draft_tree(head, draft_cache, root, root_hidden, tree)
    positions = cache.lens.to(torch.int64).unsqueeze(1) + drafted.depth

    def verify():
        hidden, _ = target(drafted.tokens, positions, cache, drafted.tree_mask,
                           head.feature_layers)
        return target.logits(hidden)

    return (lambda: draft_tree(head, draft_cache, root, root_hidden, tree)), verify


def settle_steps(step: Callable[[], object], seconds: float,
                 device: torch.device | None = None) -> None:
    """Run ``step`` untimed until ``seconds`` have passed (at least once), each run finished
    before the next on a CUDA ``device`` (not queued for the timed call to wait on): what a
    plain step costs is what it costs in a row of plain steps, as decoding runs them."""
    end = time.perf_counter() + seconds
    while True:
        step()
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        if time.perf_counter() >= end:
            return


def _step_call(target, context: int, batch: int):
    """One plain decoding step (target over one token + logits), ready to time."""
    cache = target.allocate_cache(batch, context + 1)
    cache.lens.fill_(context)
    token = torch.zeros(batch, 1, dtype=torch.int64, device=target.device)
    position = torch.full((batch, 1), context, dtype=torch.int64, device=target.device)
    ones = torch.ones(batch, 1, 1, dtype=torch.int32, device=target.device)
    return lambda: target.logits(target(token, position, cache, ones)[0])


def measure_cycle(target, head, tree: TreeConfig, context: int = 256, batch: int = 1,
                  repeats: int = 3) -> CycleCost:
    """Median seconds of drafting one ``tree`` and verifying it, as a cycle runs them (value
    checks off, as inside the generation loop: :func:`measure_trees` times them so too)."""
    with torch.inference_mode(), no_value_checks(), weights_unchanged():
        calls = cycle_calls(target, head, tree, context, batch)
        return CycleCost(*interleaved_medians(list(calls), repeats, target.device))


@dataclass
class AdaptiveTree:
    """Picks the tree with the best expected rate, from cycle costs and the acceptance observed
    so far; :meth:`observe` feeds it each cycle's accepted lengths, :meth:`time_cycle` and
    :meth:`time_step` the wall-clock seconds of the cycles and plain steps the loop runs.

    With ``step_seconds`` (a plain decoding step) it also says when no tree is worth it
    (:meth:`worth_speculating`): a head that accepts too little, on a device where a verify pass
    costs more than a decode step, makes speculation slower than plain decoding, and the engine
    then decodes plainly (probing every :data:`PROBE_EVERY` calls so the estimate keeps up, where
    a better acceptance could change the decision: :meth:`could_pay`).

    Costs: what decides is a cycle's cost in plain steps of the same moment (a 3-node cycle
    costs ~1.17 steps here when memory is slow, ~1.40 when it is fast: comparing a cycle timed
    in one state with a step timed in the other misjudges it by up to 1.7x). So a cycle timing
    with plain steps timed within :data:`PAIR_SECONDS` of it (the ours-AR call before it, the
    plain steps a call falls back to) gives a ratio, and a tree with at least
    :data:`TIMINGS_TO_TRUST` such ratios costs their median times the plain step now; any other
    tree costs the most recently timed such tree's ratio scaled by its own recent timings
    against that tree's (else by their start-up costs). When no tree has such pairs: a tree
    timed at least TIMINGS_TO_TRUST times among the last :data:`TIMING_WINDOW` cycles it ran,
    within :data:`TIMING_MAX_AGE` seconds, costs the median of those timings; any other tree its
    start-up measurement scaled by the timed / start-up ratio of the last tree so timed (the
    machine's present speed, and the cycle's work besides drafting and verify); the plain step
    likewise (only with ``step_seconds``: without a measured step the policy never decodes
    plainly). Timings are taken at ``batch`` sequences only (the start-up measurement's).
    ``online_timing=False`` keeps the start-up costs (tests that script the costs); ``clock``
    says what "now" is (tests move it). Calls running in several threads at once on one engine
    would feed it timings inflated by their contention.
    """

    costs: dict[TreeConfig, CycleCost]
    prior_alpha: float = PRIOR_ALPHA
    step_seconds: float | None = None
    batch: int = 1
    online_timing: bool = True
    clock: Callable[[], float] = time.monotonic
    history: list[tuple[TreeConfig, int]] = field(default_factory=list)  # (tree, tokens) per
    #                                                         cycle and sequence, the last MEMORY
    current: TreeConfig | None = None
    call_batch: int | None = None  # the present call's sequences (start_call); None: ``batch``
    _since_pick: int = 0
    _calls_since_probe: int = 0
    _worth: tuple | None = None  # (call_batch, worth speculating) of the last decision
    _cycle_timings: dict[TreeConfig, deque] = field(default_factory=dict)  # (when, seconds)
    _step_timings: deque = field(default_factory=lambda: deque(maxlen=TIMING_WINDOW))
    _timed_last: TreeConfig | None = None  # the last tree timed often enough to trust
    _step_samples: deque = field(default_factory=lambda: deque(maxlen=STEP_SAMPLES))
    _timings_seen: int = 0  # timings recorded so far (keys the paired-ratio memo)
    # (timings seen, valid from, valid until, (ratio per tree, tree timed last among them))
    _paired_memo: tuple = (None, 0.0, -1.0, None)

    def __post_init__(self):
        if not self.costs:
            raise ValueError("costs: expected at least one measured tree")
        self.current = self.best()

    @property
    def trees(self) -> list[TreeConfig]:
        return list(self.costs)

    @property
    def largest(self) -> TreeConfig:
        """A tree whose every size bounds every candidate's (for buffer sizing)."""
        return TreeConfig(max(t.top_k for t in self.costs), max(t.depth for t in self.costs),
                          max(t.total_tokens for t in self.costs))

    def alpha(self) -> float:
        """Per-token acceptance fitted to the cycles seen, averaged with the prior's weight.

        The fit is the alpha under which the trees that ran were expected to produce as many
        tokens as they did (sum over cycles of tree_tau(tree, alpha) = sum of tokens). Averaging
        each cycle's own inverse instead is biased low: a cycle yields 1, 2, ... tokens, whose
        inverses (0.01, 0.62, ... for a two-level chain) average below the inverse of their
        mean, so a head whose trees paid looked as if they did not."""
        seen = self.history[-MEMORY:]
        fitted = fit_alpha(seen) if seen else self.prior_alpha
        return (self.prior_alpha * PRIOR_WEIGHT + fitted * len(seen)) / (PRIOR_WEIGHT + len(seen))

    # ------------------------------------------------------------------------ costs
    def time_cycle(self, tree: TreeConfig, seconds: float, batch: int) -> None:
        """Record the wall-clock seconds of one cycle of ``tree`` over ``batch`` sequences."""
        if self.online_timing and batch == self.batch and tree in self.costs:
            timings = self._cycle_timings.setdefault(tree, deque(maxlen=TIMING_WINDOW))
            timings.append((self.clock(), seconds))
            self._timings_seen += 1
            if self._trusted(timings) is not None:
                self._timed_last = tree

    def time_step(self, seconds: float, batch: int) -> None:
        """Record the wall-clock seconds of one plain decoding step over ``batch`` sequences."""
        if self.online_timing and batch == self.batch:
            now = self.clock()
            self._step_timings.append((now, seconds))
            if not self._step_samples or now - self._step_samples[-1][0] >= STEP_SAMPLE_SECONDS:
                self._step_samples.append((now, seconds))
            self._timings_seen += 1

    def _trusted(self, timings) -> float | None:
        """Median of the timings younger than TIMING_MAX_AGE, if TIMINGS_TO_TRUST of them."""
        oldest = self.clock() - TIMING_MAX_AGE
        recent = [seconds for when, seconds in timings if when >= oldest]
        return _median(recent) if len(recent) >= TIMINGS_TO_TRUST else None

    def _scale(self) -> float:
        """Seconds now per start-up second: from the last tree timed enough, else from the
        plain step, else 1."""
        if self._timed_last is not None:
            timed = self._trusted(self._cycle_timings[self._timed_last])
            if timed is not None:
                return timed / self.costs[self._timed_last].total
        step = self._trusted(self._step_timings)
        if self.step_seconds and step is not None:
            return step / self.step_seconds
        return 1.0

    def _paired_ratios(self) -> tuple[dict[TreeConfig, float], TreeConfig | None]:
        """Median cycle / plain-step ratio of every tree with TIMINGS_TO_TRUST timings paired
        with steps timed within PAIR_SECONDS, and the one of them timed last (memoized until
        a new timing comes or one it counted ages past TIMING_MAX_AGE)."""
        now = self.clock()
        seen, since, until, memo = self._paired_memo
        if seen == self._timings_seen and since <= now <= until:
            return memo
        oldest = now - TIMING_MAX_AGE
        steps = sorted({entry for entry in (*self._step_samples, *self._step_timings)
                        if entry[0] >= oldest})
        times = [when for when, _ in steps]
        ratios, last, last_when = {}, None, None
        for tree, timings in self._cycle_timings.items():
            paired = []
            for when, seconds in timings:
                near = _nearest(times, when, PAIR_STEPS, PAIR_SECONDS) if when >= oldest else []
                if near:
                    paired.append(seconds / _median([steps[i][1] for i in near]))
            if len(paired) >= TIMINGS_TO_TRUST:
                ratios[tree] = _median(paired)
                if last_when is None or timings[-1][0] >= last_when:
                    last, last_when = tree, timings[-1][0]
        counted = [when for timings in self._cycle_timings.values() for when, _ in timings
                   if when >= oldest]
        until = min(times[:1] + counted, default=now) + TIMING_MAX_AGE  # the first to age out
        self._paired_memo = (self._timings_seen, now, until, (ratios, last))
        return ratios, last

    def steps_per_cycle(self, tree: TreeConfig) -> float | None:
        """What a cycle of ``tree`` costs in plain steps of the same moment, from cycles timed
        near plain steps (see the class docstring); None without such timings or without a
        start-up ``step_seconds``."""
        if self.step_seconds is None:
            return None
        ratios, last = self._paired_ratios()
        if tree in ratios:
            return ratios[tree]
        if last is None:
            return None
        # Relative to the paired tree: its own recent timings where it has them (timed in some
        # state, but so were last's: the state cancels), else the start-up costs.
        timed = self._trusted(self._cycle_timings.get(tree, ()))
        reference = self._trusted(self._cycle_timings[last])  # None if aged out since the memo
        if timed is not None and reference is not None:
            return timed / reference * ratios[last]
        return self.costs[tree].total / self.costs[last].total * ratios[last]

    def _has_step(self) -> bool:
        """Whether there is a positive start-up plain step to cost other batches from."""
        return (self.step_seconds or 0) > 0

    def _other_batch(self) -> bool:
        """Whether the present call runs at another batch than the measured one (and there
        is a start-up plain step to scale from)."""
        return (self.call_batch is not None and self.call_batch != self.batch
                and self._has_step())

    def _rows_seconds(self, rows: int) -> float:
        """Start-up seconds of a target forward over ``rows`` rows, interpolated linearly
        between the measured ones (a plain step: ``batch`` rows; a verify: ``batch`` x nodes),
        made non-decreasing in rows (a running maximum: timing noise must not make more rows
        cheaper), and past the largest extended at the slope from the smallest to the largest
        (not the last segment's, which noise may bend; never downwards). A call at another
        batch than the measured one is costed from these: on a CPU, compute-bound, a verify of
        4 sequences x 2 nodes costs about 8 nodes' verify, 1.7x a 4-sequence step where one
        sequence's 2 nodes cost 1.3x its step; on a GPU both stay near one step."""
        measured = sorted({self.batch: self.step_seconds,
                           **{self.batch * tree.total_tokens: cost.verify
                              for tree, cost in self.costs.items()}}.items())
        points, highest = [], 0.0
        for count, seconds in measured:
            highest = max(highest, seconds)
            points.append((count, highest))
        (n_first, s_first), (n_last, s_last) = points[0], points[-1]
        if rows <= n_first:
            return s_first
        if rows >= n_last:
            slope = (s_last - s_first) / (n_last - n_first) if n_last > n_first else 0.0
            return s_last + slope * (rows - n_last)
        right = next(i for i, (count, _) in enumerate(points) if count >= rows)
        (n0, s0), (n1, s1) = points[right - 1], points[right]
        return s0 + (s1 - s0) * (rows - n0) / (n1 - n0)

    def verify_steps(self, batch: int, nodes: int) -> float | None:
        """What a target forward over ``nodes`` nodes of each of ``batch`` sequences costs in
        plain steps of that batch, from the start-up measurement (:meth:`_rows_seconds`); None
        without a positive start-up ``step_seconds``."""
        if not self._has_step():
            return None
        return self._rows_seconds(batch * nodes) / self._rows_seconds(batch)

    def _estimated_at_call_batch(self, tree: TreeConfig | None) -> float:
        """Seconds now of a plain step (``tree`` None) or a cycle of ``tree`` at the call's
        batch, from the start-up measurement (:meth:`_rows_seconds`; drafting scaled as a
        plain step), the machine's present speed, and for a tree the share of a cycle that
        is neither drafting nor verify (acceptance, compaction, the head's commit, the loop:
        its timed cycles in plain steps over its start-up ones, at the measured batch, where
        the loop takes timings)."""
        step = self._rows_seconds(self.call_batch)
        if tree is None:
            return step * self._scale()
        cost = self.costs[tree]
        cycle = self._rows_seconds(self.call_batch * tree.total_tokens) \
            + cost.draft * step / self.step_seconds
        timed = self.steps_per_cycle(tree)
        overhead = 1.0 if timed is None else max(timed * self.step_seconds / cost.total, 1.0)
        return cycle * overhead * self._scale()

    def cycle_seconds(self, tree: TreeConfig) -> float:
        """What a cycle of ``tree`` costs now (see the class docstring), at the call's batch."""
        if self._other_batch():
            return self._estimated_at_call_batch(tree)
        relative = self.steps_per_cycle(tree)
        if relative is not None:
            return relative * self.plain_step_seconds()
        timed = self._trusted(self._cycle_timings.get(tree, ()))
        return timed if timed is not None else self.costs[tree].total * self._scale()

    def plain_step_seconds(self) -> float | None:
        """What a plain decoding step costs now, at the call's batch; None without a start-up
        ``step_seconds``."""
        if self.step_seconds is None:
            return None
        if self._other_batch():
            return self._estimated_at_call_batch(None)
        timed = self._trusted(self._step_timings)
        return timed if timed is not None else self.step_seconds * self._scale()

    def timed(self, tree: TreeConfig) -> bool:
        """Whether ``tree``'s cost now comes from timings of cycles the loop ran."""
        return (tree in self._paired_ratios()[0]
                or self._trusted(self._cycle_timings.get(tree, ())) is not None)

    # --------------------------------------------------------------------- decisions
    def rate(self, tree: TreeConfig, alpha: float | None = None) -> float:
        alpha = self.alpha() if alpha is None else alpha
        return tree_tau(tree, alpha) / self.cycle_seconds(tree)

    def best(self) -> TreeConfig:
        alpha = self.alpha()
        return max(self.costs, key=lambda tree: self.rate(tree, alpha))

    @property
    def just_repicked(self) -> bool:
        """Whether the last :meth:`observe` re-picked the tree (every REPICK_EVERY cycles): the
        engine decides to stop speculating only then, so a probe call sees a few cycles."""
        return self._since_pick == 0

    def worth_speculating(self) -> bool:
        """Whether the best tree's expected rate beats plain decoding's by GAIN_TO_SPECULATE
        (re-evaluated when the tree is re-picked and when a call starts)."""
        step = self.plain_step_seconds()
        if step is None:
            return True
        if self._worth is None or self._worth[0] != self.call_batch:
            self._worth = (self.call_batch, self._some_tree_pays(self.alpha(), step))
        return self._worth[1]

    def _some_tree_pays(self, alpha: float, step: float) -> bool:
        """Whether the best tree's rate at ``alpha`` beats plain steps of ``step`` seconds by
        GAIN_TO_SPECULATE."""
        return max(self.rate(tree, alpha) for tree in self.costs) * step >= GAIN_TO_SPECULATE

    def could_pay(self) -> bool:
        """Whether some tree would beat plain decoding by GAIN_TO_SPECULATE at the call's batch
        if the head accepted PROBE_ALPHA: where none would, what a probe could learn about
        acceptance cannot change the decision (on a 2-core CPU at batch 4 and more a 1/1/2
        cycle costs ~1.9 plain steps, for at most 1.9 tokens at that alpha)."""
        step = self.plain_step_seconds()
        return step is None or self._some_tree_pays(PROBE_ALPHA, step)

    def start_call(self, batch: int | None = None) -> bool:
        """Whether a new call of ``batch`` sequences (default: the measured ``batch``) should
        speculate: when worth it at that batch, and every PROBE_EVERY calls where a better
        acceptance could make it worth it (:meth:`could_pay`)."""
        self.call_batch = batch
        self._calls_since_probe += 1
        self._worth = None  # plain steps timed since the last decision count
        if self.worth_speculating() or (self._calls_since_probe >= PROBE_EVERY
                                        and self.could_pay()):
            self._calls_since_probe = 0
            self.current = self.best()
            self._since_pick = 0  # a call sees REPICK_EVERY cycles before it may fall back
            return True
        return False

    def observe(self, tree: TreeConfig, accepted: list[int], batch: int | None = None) -> None:
        """Record one cycle: ``accepted[b]`` draft tokens accepted by each active sequence of
        a call of ``batch`` sequences (default: the measured batch), for which the tree is
        re-picked (the calls of streams may interleave: each cycle says its own batch)."""
        self.call_batch = batch
        self.history += [(tree, count + 1) for count in accepted]
        del self.history[:-MEMORY]
        self._since_pick += 1
        if self._since_pick >= REPICK_EVERY:
            self._since_pick = 0
            self.current = self.best()
            self._worth = None

    def report(self) -> str:
        alpha = self.alpha()
        rows = ", ".join(f"{t.top_k}/{t.depth}/{t.total_tokens}: draft "
                         f"{c.draft * 1e3:.1f} + verify {c.verify * 1e3:.1f} ms"
                         + (f" (timed {self.cycle_seconds(t) * 1e3:.1f} ms a cycle"
                            + ("" if self.steps_per_cycle(t) is None else
                               f" = {self.steps_per_cycle(t):.2f} plain steps") + ")"
                            if self.timed(t) else "")
                         for t, c in self.costs.items())
        tree = self.current
        step = self.plain_step_seconds()
        step = "" if step is None else (
            f"; plain decoding step {step * 1e3:.1f} ms"
            f"{'' if self.worth_speculating() else ' (faster than any tree at this alpha)'}")
        return (f"tree budget: top_k={tree.top_k} depth={tree.depth} "
                f"total_tokens={tree.total_tokens} (expected tau {tree_tau(tree, alpha):.2f} at "
                f"alpha {alpha:.2f}, adapted online from accepted lengths); cycle costs {rows}"
                f"{step}")


def measure_trees(target, head, trees=CANDIDATE_TREES, batch: int = 1, context: int = 256,
                  repeats: int = 5) -> tuple[dict[TreeConfig, CycleCost], float]:
    """Cycle costs of every candidate tree on this device and a plain decoding step's
    seconds, all timed in the same interleaved rounds, each relative to the plain step of its
    round (see :func:`relative_medians`); value checks off, as inside the generation loop.

    Each round opens with plain steps run untimed for SETTLE_SECONDS (:func:`settle_steps`),
    then the timed step, then the trees in the order given (CANDIDATE_TREES: the smallest
    first): a step is timed as it runs in a row of steps, not in the wake of the largest tree's
    verify (see SETTLE_SECONDS)."""
    trees = list(trees)
    with torch.inference_mode(), no_value_checks(), weights_unchanged():  # as the loop runs
        step = _step_call(target, context, batch)
        calls = [step] + [call for tree in trees
                          for call in cycle_calls(target, head, tree, context, batch)]
        seconds = relative_medians(calls, repeats, target.device, reference=0,
                                   settle=lambda: settle_steps(step, SETTLE_SECONDS,
                                                               target.device))
    costs = {tree: CycleCost(seconds[1 + 2 * i], seconds[2 + 2 * i])
             for i, tree in enumerate(trees)}
    return costs, seconds[0]


def trees_that_can_pay(costs: dict[TreeConfig, CycleCost], step: float) -> list[TreeConfig]:
    """The trees of ``costs`` whose cycle (drafting + verify) costs at most as many plain steps of
    ``step`` seconds as the most tokens it can yield (``max_depth + 1``: every draft on a path
    accepted, plus the bonus token): a costlier tree is slower than plain decoding whatever the
    head. The first tree is always kept (the policy needs one; where it does not pay either, the
    policy decodes plainly). On a 2-core CPU this drops the trees of 24 nodes and more (their
    verify costs 8-20 steps; 12-16 nodes sit near the line), on a GPU, where a verify costs
    about a step, none."""
    trees = list(costs)
    return [tree for tree in trees if tree == trees[0]
            or costs[tree].total <= (tree.max_depth + 1) * step]


def choose_tree(target, head, batch: int = 1, context: int = 256,
                alpha: float = PRIOR_ALPHA, repeats: int = 5,
                trees=CANDIDATE_TREES, prune: bool = True) -> AdaptiveTree:
    """Measure every candidate tree's cycle and a plain decoding step here; return the policy
    (its ``current`` tree is the best under the prior ``alpha`` until acceptance is observed).
    With ``prune`` a first timed round keeps only :func:`trees_that_can_pay` for the ``repeats``
    rounds and the policy (on a 2-core CPU a third of the start-up time: the large trees'
    verify passes dominate each round)."""
    if prune and len(trees) > 1:
        trees = trees_that_can_pay(*measure_trees(target, head, trees, batch, context, repeats=1))
    costs, step = measure_trees(target, head, trees, batch, context, repeats)
    policy = AdaptiveTree(costs, alpha, step, batch=batch)
    # The plain step just measured is a step timing of this moment: the cycles of a call that
    # starts within PAIR_SECONDS pair with it. Without it, a first call that speculates has no
    # plain step to compare its cycles with, scales the step by its cycles' timed / start-up
    # ratio (which also holds the cycle's work besides drafting and verify: acceptance,
    # compaction, the head's commit) and keeps speculating at a loss (make demo: a 1/1/2 cycle
    # timed 1.45 steps, estimated 1.25; 0.93x plain decoding).
    policy.time_step(step, batch)
    return policy
