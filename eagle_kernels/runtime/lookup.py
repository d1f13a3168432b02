"""Drafts from the context itself (prompt lookup), for the steps a speculative call would
otherwise decode plainly.

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
is exactly a plain step.

Draft length follows the match: n matched tokens propose n more (n from LOOKUP_MAX_NGRAM down
to LOOKUP_MIN_NGRAM; longer matches are likelier to continue). Chosen on the target's greedy
replies to 30 + 30 held-out HumanEval / ShareGPT prompts x 128 tokens, with the CPU's measured
verify costs (2 / 3 / 4 / 5 nodes = 1.24 / 1.55 / 1.85 / 2.2 plain steps): modelled speedups
over plain decoding 1.30 / 1.16 for this rule, against 1.26 / 1.15 for a fixed 2 tokens after a
2-3 token match, 1.06 / 0.93 for 4 tokens after any 1-3 token match.

Drafts that do not pay are dropped: every LOOKUP_WINDOW steps with a draft, the tokens per
second they produced are compared with plain steps' (timed by the step itself, the latest
LOOKUP_WINDOW of each); when the drafts lost, the next LOOKUP_PAUSE steps are plain, then
drafting is tried again (a reply may start to repeat itself later).
"""

from __future__ import annotations

import time
from collections import deque

import torch

from .. import ops
from .drafting import causal_tree_mask

LOOKUP_MIN_NGRAM = 2  # shortest match that proposes a draft (1-token matches mislead)
LOOKUP_MAX_NGRAM = 4  # longest match looked for; a draft has at most this many tokens
LOOKUP_WINDOW = 16  # steps with a draft between two checks that drafting beats plain steps
LOOKUP_PAUSE = 64  # plain steps after drafts were found to lose, before they are tried again


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

    def propose(self, row: int, limit: int) -> list[int]:
        """Up to min(n, limit) tokens that followed the latest earlier occurrence of the
        sequence's last n tokens, for the longest n that occurred; [] when none did."""
        history, follower = self.tokens[row], self.follower[row]
        for n in range(min(LOOKUP_MAX_NGRAM, len(history)), LOOKUP_MIN_NGRAM - 1, -1):
            start = follower.get(tuple(history[-n:]))
            if start is not None:
                return history[start:start + min(n, limit)]
        return []


class LookupStep:
    """A plain decoding step of a greedy call that verifies a context draft when there is one.

    Called like the engine's plain step, ``(root, accept_u, bonus_u)`` -> (next root, recorded
    counts, accepted drafts, active), all [B] int64. ``last_was_plain`` tells the tree budget
    whether the step it just timed was a plain step. The context index is built at the first
    call from the prompts and the tokens recorded so far, so the step can take over mid-call.
    ``clock``: seconds, for the check that drafts pay (see the module docstring).
    """

    def __init__(self, target, cache, call, prompts: list[list[int]], plain_step,
                 max_draft: int, clock=None):
        self.target, self.cache, self.call = target, cache, call
        self.prompts, self.plain_step = prompts, plain_step
        self.max_draft = max(0, min(max_draft, LOOKUP_MAX_NGRAM))
        self.index: ContextIndex | None = None
        self.last_was_plain = True
        self.clock = clock or time.perf_counter
        # (tokens produced by active rows, seconds) of the latest steps of each kind
        self.timed = {kind: deque(maxlen=LOOKUP_WINDOW) for kind in ("plain", "draft")}
        self.drafts_since_check = 0
        self.paused = 0  # plain steps left before drafting is tried again

    def __call__(self, root: torch.Tensor, accept_u: torch.Tensor, bonus_u: torch.Tensor):
        call = self.call
        if self.index is None:
            generated, out = call.generated.tolist(), call.out.tolist()
            self.index = ContextIndex([prompt + out[b][:generated[b]]
                                       for b, prompt in enumerate(self.prompts)])
        began = self.clock()
        done = call.done.tolist()
        # A row's draft is at most the tokens it may still record but one (its chain also
        # yields the target's next token), and a row accepts no more than its own draft (see
        # _verify), so an accepted chain never runs past the budget.
        left = (call.budgets - call.generated).tolist()
        drafts = [[] if stop or self.paused else
                  self.index.propose(b, max(min(self.max_draft, left[b] - 1), 0))
                  for b, stop in enumerate(done)]
        self.paused = max(self.paused - 1, 0)
        width = max(map(len, drafts))
        self.last_was_plain = width == 0
        if width == 0:
            outputs = self.plain_step(root, accept_u, bonus_u)
            new_tokens = outputs[0].unsqueeze(1)
        else:
            outputs = self._verify(root, drafts, width)
            new_tokens = outputs[-1]
            outputs = outputs[:-1]
        rows, counts = new_tokens.tolist(), outputs[1].tolist()
        if width:
            call.stats.lookup_steps += 1
            # drafted tokens recorded (not what an EOS cut off)
            call.stats.lookup_accepted += sum(
                min(accepted, max(count - 1, 0))
                for accepted, count in zip(outputs[2].tolist(), counts))
        for b, count in enumerate(counts):
            if count:
                self.index.extend(b, rows[b][:count])
        self._time(width > 0, sum(counts), self.clock() - began)
        return outputs

    def _time(self, drafted: bool, tokens: int, seconds: float) -> None:
        """Record a step; after every LOOKUP_WINDOW drafted steps, pause drafting for
        LOOKUP_PAUSE steps if they produced fewer tokens per second than plain steps."""
        if tokens == 0:  # every row finished: nothing to learn from
            return
        self.timed["draft" if drafted else "plain"].append((tokens, seconds))
        if not drafted:
            return
        self.drafts_since_check += 1
        plain = self.timed["plain"]
        if self.drafts_since_check < LOOKUP_WINDOW:
            return
        if not plain:  # every step drafted: time one plain step to compare with
            self.paused = 1
            return
        self.drafts_since_check = 0
        draft = self.timed["draft"]
        draft_rate = sum(t for t, _ in draft) / max(sum(s for _, s in draft), 1e-12)
        plain_rate = sum(t for t, _ in plain) / max(sum(s for _, s in plain), 1e-12)
        if draft_rate < plain_rate:
            self.paused = LOOKUP_PAUSE
            self.call.stats.lookup_pauses += 1

    def _verify(self, root: torch.Tensor, drafts: list[list[int]], width: int):
        """One target forward over [root, draft] chains -> the step's outputs and the chains'
        output tokens. A shorter draft is padded with its last token (or the root), and its
        row accepts at most its own draft's length: the first k + 1 output tokens of a greedy
        chain that accepted more than k are still the target's argmax after nodes 0..k."""
        call, cache, target = self.call, self.cache, self.target
        roots = root.tolist()
        chains = []
        for token, draft in zip(roots, drafts):
            chain = [token, *draft]
            chains.append(chain + [chain[-1]] * (width + 1 - len(chain)))
        device = root.device
        tokens = torch.tensor(chains, dtype=torch.int64, device=device)
        positions = (cache.lens.to(torch.int64).unsqueeze(1)
                     + torch.arange(width + 1, device=device))
        hidden, _ = target(tokens, positions, cache,
                           causal_tree_mask(len(chains), width + 1, device))
        result = ops.greedy_accept_chain(tokens, target.logits(hidden))
        lengths = torch.tensor([len(draft) for draft in drafts], device=device)
        accepted = torch.minimum(result.num_accepted.to(torch.int64), lengths)
        # The accepted chain's K/V already sit right after the prefix: no compaction.
        active = ~call.done
        produced = ((accepted + 1) * active).to(torch.int32)
        cache.lens += produced
        counts = call.record(result.output_tokens, produced)
        next_root = result.output_tokens.gather(1, accepted.unsqueeze(1)).squeeze(1)
        return next_root, counts, accepted * active, active.to(torch.int64), result.output_tokens
