"""Drafts from the context itself (prompt lookup), in the cycles and plain steps of speculative
calls.

When the adaptive tree finds that no tree of the draft head beats plain decoding here (on a
2-core CPU the Q4 verify is compute-bound: every extra node costs ~0.25-0.3 of a plain step, and
the bundled head's acceptance does not pay for it), a speculative call decodes plainly. Those
steps can still guess: replies repeat their prompt and themselves (names, code, phrases), so
the tokens that followed the most recent earlier occurrence of the last n tokens are a cheap
draft (prompt lookup decoding, as transformers' ``prompt_lookup_num_tokens``). A step with such
a draft verifies the chain [root, drafted tokens] in one target forward and keeps the longest
prefix the target's argmax agrees with, plus the target's next token: greedy acceptance of any
draft is lossless, and the verify pass computes each token's logits bit for bit as a plain step
would (row-invariant kernels), so the output is the plain greedy output. A step without a draft
is exactly a plain step. A sampling call verifies the same drafts by rejection sampling
(``stochastic_accept_tree`` with the draft as a deterministic candidate): the draft depends only
on the tokens so far, never on the step's uniforms, so every emitted token follows the target's
sampling distribution exactly. Cycles of the head's tree take context drafts too (where the decode
loop runs eagerly: a captured CUDA graph cannot ask the host for a draft): a cycle whose
sequences have one verifies the chain instead of drafting a tree, and feeds the head the
accepted tokens as any cycle does. A plain step whose context has no draft may take one token
from the engine's reply store instead (:mod:`.reply_store`), verified the same way.

Draft length follows the match: n matched tokens propose n more (n from LOOKUP_MAX_NGRAM down
to LOOKUP_MIN_NGRAM; longer matches are likelier to continue). Chosen on the target's greedy
replies to 30 + 30 held-out HumanEval / ShareGPT prompts x 128 tokens, with the CPU's measured
verify costs (2 / 3 / 4 / 5 nodes = 1.24 / 1.55 / 1.85 / 2.2 plain steps): modelled speedups
over plain decoding 1.30 / 1.16 for this rule, against 1.26 / 1.15 for a fixed 2 tokens after a
2-3 token match, 1.06 / 0.93 for 4 tokens after any 1-3 token match.

Drafts that do not pay are dropped: every LOOKUP_WINDOW steps with a draft, how fast they
moved the call (:func:`call_progress` per second) is compared with the steps without one (plain
steps, or cycles of the head's tree; the latest LOOKUP_WINDOW of each, timed here); when the
drafts lost, the next LOOKUP_PAUSE steps go without, then drafting is tried again (a reply may
start to repeat itself later). A batch takes drafts only where the tree budget expects their
verify pass to cost about a plain step (LOOKUP_BATCH_MAX_VERIFY_STEPS).
"""

from __future__ import annotations

import time
from collections import deque

import torch

from .. import ops
from ..ops.reference import chain_paths
from .drafting import causal_tree_mask

LOOKUP_MIN_NGRAM = 2  # shortest match that proposes a draft (1-token matches mislead)
LOOKUP_MAX_NGRAM = 4  # longest match looked for; a draft has at most this many tokens
# Shortest match whose draft replaces the head's tree in a cycle. On the replies above a
# 2-token match's 2-token draft accepts 0.84 tokens on average, a 3-token match's 1.35-1.7 and
# a 4-token match's 2.7; a CPU 1/1/2 cycle of the bundled head accepts ~0.4-0.45 for a bit
# less verify work, so 2-token matches gain little over it and lost where they missed (a
# 64-token code reply: 6 such cycles, 2 tokens accepted, 0.90-0.94x against 0.99-1.01x).
LOOKUP_MIN_NGRAM_IN_CYCLES = 3
LOOKUP_WINDOW = 16  # steps with a draft between two checks that drafting beats the others
LOOKUP_PAUSE = 64  # steps without drafts after drafts were found to lose, before a retry
# A batched step takes context drafts only where verifying the chains costs at most this many
# plain steps of the batch (the tree budget's estimate): the call advances by its slowest row,
# so a batch gains far less from drafts than one sequence does, and on a 2-core CPU a step of
# 4 sequences' 5-node chains costs 3.6 plain steps (4 prompts x 96 tokens: 0.88-0.97x plain
# decoding with 3 such steps); on a GPU, where the verify costs about a step, batches keep them.
LOOKUP_BATCH_MAX_VERIFY_STEPS = 1.25


class ContextIndex:
    """Per sequence: its tokens so far and, for every n-gram (n in [LOOKUP_MIN_NGRAM,
    LOOKUP_MAX_NGRAM]) with a token after it, where that token stands in its latest occurrence.
    Kept up to date token by token (a dict update per n per token), so a proposal is a few dict
    reads, not a scan of the context."""

    def __init__(self, sequences: list[list[int]]):
        self.tokens: list[list[int]] = [[] for _ in sequences]
        self.follower: list[dict[tuple[int, ...], int]] = [{} for _ in sequences]
        for row, sequence in enumerate(sequences):
            self.extend(row, sequence)

    def extend(self, row: int, tokens: list[int]) -> None:
        history, follower = self.tokens[row], self.follower[row]
        for token in tokens:
            end = len(history)  # the n-grams ending just before `token` now have a follower
            for n in range(LOOKUP_MIN_NGRAM, min(LOOKUP_MAX_NGRAM, end) + 1):
                follower[tuple(history[end - n:end])] = end
            history.append(token)

    def propose(self, row: int, limit: int, min_ngram: int = LOOKUP_MIN_NGRAM) -> list[int]:
        """Up to min(n, limit) tokens that followed the latest earlier occurrence of the
        sequence's last n tokens, for the longest n >= ``min_ngram`` that occurred; [] when
        none did."""
        history, follower = self.tokens[row], self.follower[row]
        lowest = max(min_ngram, LOOKUP_MIN_NGRAM)
        for n in range(min(LOOKUP_MAX_NGRAM, len(history)), lowest - 1, -1):
            start = follower.get(tuple(history[-n:]))
            if start is not None:
                return history[start:start + min(n, limit)]
        return []


class ContextDrafts:
    """One call's context drafts: the index of its sequences, each step's drafts (capped to
    what a row may still record), and the check that they pay (see the module docstring).
    With ``store`` (a :class:`~.reply_store.ReplyStore`), a plain step's row without a context
    draft takes the store's one token instead (paused with the rest; never in a cycle).

    ``propose()`` starts a step and returns each sequence's draft ([] for none, all [] while
    paused); ``observe(...)`` ends it with what the step recorded. The index is built at the
    first proposal from the prompts and the tokens recorded so far, so drafting can start
    mid-call. ``clock``: seconds.
    """

    def __init__(self, call, prompts: list[list[int]], clock=None, verify_steps=None,
                 store=None):
        self.call, self.prompts = call, prompts
        # a ReplyStore (.reply_store): a plain step's draft where the context has none
        self.store = store
        # verify_steps(batch, nodes): plain steps a forward over the chains costs (the tree
        # budget's AdaptiveTree.verify_steps); None: batched steps take drafts whatever the cost
        self.verify_steps = verify_steps
        self.index: ContextIndex | None = None
        self.clock = clock or time.perf_counter
        # (call_progress, seconds) of the latest steps with and without drafts
        self.timed = {kind: deque(maxlen=LOOKUP_WINDOW) for kind in ("other", "draft")}
        self.drafts_since_check = 0
        self.store_rows: list[int] = []  # rows whose draft of the current step is the store's
        self.paused = 0  # steps left before drafting is tried again
        self._began = 0.0

    def propose(self, in_cycle: bool = False) -> list[list[int]]:
        """Each sequence's draft ([] for a finished one). In a plain step, a batch's drafts
        only where verifying them costs at most LOOKUP_BATCH_MAX_VERIFY_STEPS plain steps: a
        batched call lasts as many steps as its slowest row needs, so drafts make some rows
        finish earlier and the call hardly sooner, while the verify pass over every row's
        chain costs several plain steps on a CPU (4 prompts x 96 tokens: 0.70-0.78x plain
        decoding with the drafts taken, 17 such steps accepting 64 tokens). ``in_cycle`` (the
        draft would replace the head's tree): matches of LOOKUP_MIN_NGRAM_IN_CYCLES tokens or
        more, and all [] unless every unfinished sequence has one (a row without would lose
        its tree)."""
        call = self.call
        if self.index is None:
            generated, out = call.generated.tolist(), call.out.tolist()
            self.index = ContextIndex([prompt + out[b][:generated[b]]
                                       for b, prompt in enumerate(self.prompts)])
        self._began = self.clock()
        done = call.done.tolist()
        # A row's draft is at most the tokens it may still record but one (its chain also
        # yields the target's next token), and a row accepts no more than its own draft
        # (within_drafts), so an accepted chain never runs past the budget.
        left = (call.budgets - call.generated).tolist()
        paused, self.paused = self.paused, max(self.paused - 1, 0)
        shortest = LOOKUP_MIN_NGRAM_IN_CYCLES if in_cycle else LOOKUP_MIN_NGRAM
        drafts = [[] if stop or paused else
                  self.index.propose(b, max(min(LOOKUP_MAX_NGRAM, left[b] - 1), 0), shortest)
                  for b, stop in enumerate(done)]
        self.store_rows = []
        # the store drafts in plain steps only: a cycle's draft replaces the head's tree
        if self.store is not None and not in_cycle and not paused:
            drafts, self.store_rows = self._with_store_drafts(drafts, done, left)
        if in_cycle and not all(draft or stop for draft, stop in zip(drafts, done)):
            return [[] for _ in drafts]
        # (in a cycle the chain replaces a tree, which a batch verifies anyway)
        if not in_cycle and len(drafts) > 1 and any(drafts) and not self._cheap_for_a_batch(
                drafts):
            self.store_rows = []
            return [[] for _ in drafts]
        if self.store_rows:
            call.stats.store_steps += 1
        return drafts

    def _with_store_drafts(self, drafts, done, left) -> tuple[list[list[int]], list[int]]:
        """Rows without a context draft take the reply store's (one token: it needs room for
        itself and the step's own token); returns the drafts and the rows it drafted for."""
        extra = [[] if draft or stop or left[b] < 2 else self.store.draft(self.index.tokens[b])
                 for b, (draft, stop) in enumerate(zip(drafts, done))]
        rows = [b for b, more in enumerate(extra) if more]
        return [draft or more for draft, more in zip(drafts, extra)], rows

    def _cheap_for_a_batch(self, drafts: list[list[int]]) -> bool:
        if self.verify_steps is None:
            return True
        cost = self.verify_steps(len(drafts), max(map(len, drafts)) + 1)
        return cost is None or cost <= LOOKUP_BATCH_MAX_VERIFY_STEPS

    def observe(self, drafts: list[list[int]], new_tokens: torch.Tensor, counts: torch.Tensor,
                accepted: torch.Tensor) -> None:
        """End a step: ``new_tokens`` [B, W] of which ``counts`` [B] were recorded; with
        drafts, ``accepted`` [B] drafted tokens accepted per row (before any EOS cut)."""
        rows, counts = new_tokens.tolist(), counts.tolist()
        drafted = any(drafts)
        if drafted:
            stats = self.call.stats
            stats.lookup_steps += 1
            # drafted tokens recorded (not what an EOS cut off), per row
            kept = [min(a, max(c - 1, 0)) for a, c in zip(accepted.tolist(), counts)]
            stats.lookup_accepted += sum(kept)
            stats.store_accepted += sum(kept[b] for b in self.store_rows)
        for b, count in enumerate(counts):
            if count:
                self.index.extend(b, rows[b][:count])
        produced = [a + 1 for a in accepted.tolist()]  # per row, before any EOS cut
        self._time(drafted, call_progress(counts, produced), self.clock() - self._began)

    def _time(self, drafted: bool, tokens: int, seconds: float) -> None:
        """Record a step; after every LOOKUP_WINDOW drafted steps, pause drafting for
        LOOKUP_PAUSE steps if they moved the call less per second than the others."""
        if tokens == 0:  # every row finished: nothing to learn from
            return
        self.timed["draft" if drafted else "other"].append((tokens, seconds))
        if not drafted:
            return
        self.drafts_since_check += 1
        other = self.timed["other"]
        if self.drafts_since_check < LOOKUP_WINDOW:
            return
        if not other:  # every step drafted: time one without to compare with
            self.paused = 1
            return
        self.drafts_since_check = 0
        draft = self.timed["draft"]
        draft_rate = sum(t for t, _ in draft) / max(sum(s for _, s in draft), 1e-12)
        other_rate = sum(t for t, _ in other) / max(sum(s for _, s in other), 1e-12)
        if draft_rate < other_rate:
            self.paused = LOOKUP_PAUSE
            self.call.stats.lookup_pauses += 1


def call_progress(counts: list[int], produced: list[int] | None = None) -> int:
    """How far a step moved its call, in tokens: the rows that recorded tokens times the fewest
    any of them recorded (one row: its count). A batched call lasts as many steps as its slowest
    row needs, so the tokens some rows accept beyond the others' do not make it finish sooner.
    A row that recorded fewer than the step ``produced`` for it (an EOS or the length limit cut
    it) finishes here and holds the call back no longer: the fewest is taken over the others
    (every row cut: the tokens recorded). ``produced`` None: no row was cut."""
    recorded = [count for count in counts if count]
    if not recorded:
        return 0
    produced = counts if produced is None else produced
    whole = [count for count, made in zip(counts, produced) if count and count >= made]
    return len(recorded) * min(whole) if whole else sum(recorded)


def chain_tree(root: torch.Tensor, drafts: list[list[int]]) -> ops.DraftTree:
    """The chains [root, draft] as a batch of chain-shaped trees of the widest draft's length
    + 1 nodes (a shorter draft padded with its last token, or the root; within_drafts keeps
    its row from accepting the padding)."""
    width = max(map(len, drafts)) + 1
    chains = []
    for token, draft in zip(root.tolist(), drafts):
        chain = [token, *draft]
        chains.append(chain + [chain[-1]] * (width - len(chain)))
    device, batch = root.device, len(chains)
    nodes = torch.arange(width, device=device)
    return ops.DraftTree(
        tokens=torch.tensor(chains, dtype=torch.int64, device=device),
        parents=(nodes - 1).to(torch.int32).expand(batch, -1).contiguous(),
        depth=nodes.expand(batch, -1).contiguous(),
        scores=torch.zeros(batch, width, device=device),
        tree_mask=causal_tree_mask(batch, width, device),
        paths=chain_paths(batch, width, device).contiguous())


def within_drafts(result: ops.AcceptResult, drafts: list[list[int]]) -> ops.AcceptResult:
    """A chain's acceptance cut to each row's own draft. Greedy: the first k + 1 output tokens
    of a chain that accepted more than k drafts are still the target's argmax after nodes
    0..k, so the cut result is what verifying the unpadded draft would have given. Sampling:
    output token k is then padding node k + 1's token, accepted with probability p_k(token),
    else drawn from p_k without it, renormalised: distributed as p_k, the target's
    distribution after node k, exactly like the bonus token of the unpadded draft."""
    device = result.num_accepted.device
    lengths = torch.tensor([len(draft) for draft in drafts], device=device)
    accepted = torch.minimum(result.num_accepted.to(torch.int64), lengths)
    steps = torch.arange(result.accepted_nodes.shape[1], device=device)
    nodes = torch.where(steps <= accepted.unsqueeze(1), result.accepted_nodes,
                        torch.full_like(result.accepted_nodes, -1))
    return ops.AcceptResult(result.output_tokens, accepted.to(result.num_accepted.dtype), nodes)


def accept_chain(tree: ops.DraftTree, logits: torch.Tensor, call,
                 bonus_u: torch.Tensor) -> ops.AcceptResult:
    """Acceptance of a context chain: the target's argmax for a greedy call; for a sampling
    call rejection sampling of the deterministic draft (``stochastic_accept_tree``: the emitted
    tokens follow the target's distribution exactly, since the draft is fixed by the tokens so
    far before this step's uniforms are drawn), with fresh acceptance uniforms for the chain's
    nodes and the step's own bonus uniform."""
    batch, width = tree.tokens.shape
    accept_u = None if call.sampling.greedy else call.uniforms(batch, width)
    return call.accept(tree, logits, accept_u, bonus_u, width - 1)


class LookupStep:
    """A plain decoding step of a speculative call that verifies a context draft when there
    is one.

    Called like the engine's plain step, ``(root, accept_u, bonus_u)`` -> (next root, recorded
    counts, accepted drafts, active), all [B] int64. ``last_was_plain`` tells the tree budget
    whether the step it just timed was a plain step.
    """

    def __init__(self, target, cache, call, context: ContextDrafts, plain_step):
        self.target, self.cache, self.call = target, cache, call
        self.context, self.plain_step = context, plain_step
        self.last_was_plain = True

    def __call__(self, root: torch.Tensor, accept_u: torch.Tensor, bonus_u: torch.Tensor):
        drafts = self.context.propose()
        self.last_was_plain = not any(drafts)
        if self.last_was_plain:
            outputs = self.plain_step(root, accept_u, bonus_u)
            new_tokens = outputs[0].unsqueeze(1)
        else:
            *outputs, new_tokens = self._verify(root, drafts, bonus_u)
        self.context.observe(drafts, new_tokens, outputs[1], outputs[2])
        return tuple(outputs)

    def _verify(self, root: torch.Tensor, drafts: list[list[int]], bonus_u: torch.Tensor):
        """One target forward over the chains -> the step's outputs and the chains' output
        tokens."""
        call, cache, target = self.call, self.cache, self.target
        tree = chain_tree(root, drafts)
        positions = cache.lens.to(torch.int64).unsqueeze(1) + tree.depth
        hidden, _ = target(tree.tokens, positions, cache, tree.tree_mask)
        result = within_drafts(accept_chain(tree, target.logits(hidden), call, bonus_u), drafts)
        # The accepted chain's K/V already sit right after the prefix: no compaction.
        active = ~call.done
        accepted = result.num_accepted.to(torch.int64)
        produced = ((accepted + 1) * active).to(torch.int32)
        cache.lens += produced
        counts = call.record(result.output_tokens, produced)
        next_root = result.output_tokens.gather(1, accepted.unsqueeze(1)).squeeze(1)
        return next_root, counts, accepted * active, active.to(torch.int64), result.output_tokens
