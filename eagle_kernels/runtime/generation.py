"""The draft -> verify -> accept loop, and the autoregressive baseline on the same code.

:class:`Engine` owns a target model, an optional draft head and their static caches. Both modes
share prefill, token selection (the same acceptance ops: greedy argmax, or the target's
temperature / top-k / top-p distribution) and the stop rules (EOS, max new tokens, cache length),
so a speedup compares like with like and greedy speculative output can be checked token for
token against greedy autoregressive output.

One speculative cycle for B sequences, all on the device:
draft tree (:func:`~.drafting.draft_tree`) -> target forward over the N tree nodes with the
packed tree mask -> accept (greedy or rejection sampling) -> move the accepted path's K/V next to
the prefix (:func:`eagle_kernels.ops.compact_kv`) -> feed the accepted features and tokens to
the head (:func:`~.drafting.commit`) -> record the new tokens. The only host read per cycle is
one small tensor for the stop decision and the statistics.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .. import ops
from .draft_heads import DraftHead
from .drafting import TreeConfig, causal_tree_mask, commit, draft_tree, gather_rows
from .graphs import GraphedStep
from .model import TargetModel


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; otherwise the target's tempered, top-k/top-p distribution."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature: expected >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k: expected an int >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: expected 0 < top_p <= 1, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class GenerationStats:
    """What one generate call measured."""

    mode: str
    cycles: int = 0
    new_tokens: list[int] = field(default_factory=list)
    accepted_histogram: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    capture_seconds: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens per cycle per sequence (accepted draft tokens + 1)."""
        cycles = sum(self.accepted_histogram)
        return sum((n + 1) * c for n, c in enumerate(self.accepted_histogram)) / max(cycles, 1)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens (all sequences) over prefill + decode wall time (graph capture,
        a one-off per call, is reported apart in ``capture_seconds``)."""
        return sum(self.new_tokens) / max(self.prefill_seconds + self.decode_seconds, 1e-9)

    def summary(self) -> dict:
        return {"mode": self.mode, "cycles": self.cycles, "new_tokens": self.new_tokens,
                "tau": round(self.tau, 3), "tokens_per_second": round(self.tokens_per_second, 2),
                "accepted_histogram": self.accepted_histogram,
                "prefill_seconds": round(self.prefill_seconds, 4),
                "decode_seconds": round(self.decode_seconds, 4),
                "capture_seconds": round(self.capture_seconds, 4)}


@dataclass
class GenerationOutput:
    tokens: list[list[int]]
    stop_reasons: list[str]
    stats: GenerationStats


class _Batch:
    """Device state of one generate call: output buffer, counters, stop flags, sampling rng."""

    def __init__(self, budgets: list[int], width: int, eos: Sequence[int],
                 sampling: SamplingConfig, device: torch.device):
        batch, max_new_tokens = len(budgets), max(budgets)
        self.out = torch.full((batch, max_new_tokens + width), -1, dtype=torch.int64,
                              device=device)
        self.generated = torch.zeros(batch, dtype=torch.int64, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.eos = torch.tensor(sorted(set(eos)) or [-1], dtype=torch.int64, device=device)
        self.budgets = torch.tensor(budgets, dtype=torch.int64, device=device)
        self.sampling = sampling
        self.rng = None
        if not sampling.greedy:
            self.rng = torch.Generator(device=device)
            self.rng.manual_seed(sampling.seed if sampling.seed is not None else
                                 int(torch.randint(0, 2**62, (1,)).item()))

    def record(self, new_tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Append the first ``counts[b]`` of ``new_tokens`` [B, W]; cut at EOS and the budget.

        Returns the counts actually recorded (0 for finished sequences).
        """
        width = new_tokens.shape[1]
        steps = torch.arange(width, device=new_tokens.device).unsqueeze(0)
        counts = torch.where(self.done, 0, counts.to(torch.int64))
        is_eos = (steps < counts.unsqueeze(1)) & torch.isin(new_tokens, self.eos)
        hit_eos = is_eos.any(1)
        counts = torch.where(hit_eos, is_eos.int().argmax(1) + 1, counts)
        counts = torch.minimum(counts, self.budgets - self.generated)
        rows = torch.arange(new_tokens.shape[0], device=new_tokens.device).unsqueeze(1)
        columns = self.generated.unsqueeze(1) + steps
        keep = steps < counts.unsqueeze(1)
        self.out[rows, columns] = torch.where(keep, new_tokens, self.out[rows, columns])
        self.generated += counts
        self.done |= hit_eos | (self.generated >= self.budgets)
        return counts

    def uniforms(self, *shape) -> torch.Tensor:
        return torch.rand(*shape, generator=self.rng, device=self.out.device)


class Engine:
    """Target model + optional draft head, with static caches sized per generate call."""

    def __init__(self, target: TargetModel, head: DraftHead | None = None,
                 tree: TreeConfig | None = None, cuda_graphs: bool = True):
        self.target = target
        self.head = head
        self.tree = tree or TreeConfig()
        self.cuda_graphs = cuda_graphs  # on CUDA devices; CPU always runs eagerly
        self.graph_status = "eager (not a CUDA device)"

    @property
    def device(self) -> torch.device:
        return self.target.device

    # ----------------------------------------------------------------------- token choice
    def _uniforms(self, state: _Batch, nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Acceptance uniforms [B, nodes] and bonus uniforms [B] for one cycle (zeros: greedy)."""
        batch = state.out.shape[0]
        if state.sampling.greedy:
            return (torch.zeros(batch, nodes, device=self.device),
                    torch.zeros(batch, device=self.device))
        return state.uniforms(batch, nodes), state.uniforms(batch)

    def _accept_root_only(self, logits, state: _Batch, accept_u, bonus_u) -> torch.Tensor:
        """The next token from last-position logits [B, V]: greedy or sampled, via the ops."""
        batch = logits.shape[0]
        tokens = torch.zeros(batch, 1, dtype=torch.int64, device=logits.device)
        logits = logits.unsqueeze(1)
        if state.sampling.greedy:
            result = ops.greedy_accept_chain(tokens, logits)
        else:
            s = state.sampling
            parents = torch.full((batch, 1), -1, dtype=torch.int32, device=logits.device)
            result = ops.stochastic_accept_tree(tokens, parents, logits, accept_u[:, :1], bonus_u,
                                                0, s.temperature, s.top_k, s.top_p)
        return result.output_tokens[:, 0]

    def _accept_tree(self, tree: ops.DraftTree, logits, state: _Batch, accept_u,
                     bonus_u) -> ops.AcceptResult:
        if state.sampling.greedy:
            return ops.greedy_accept_tree(tree.tokens, tree.paths, logits)
        s = state.sampling
        return ops.stochastic_accept_tree(tree.tokens, tree.parents, logits, accept_u, bonus_u,
                                          self.tree.max_depth, s.temperature, s.top_k, s.top_p)

    # --------------------------------------------------------------------------- prefill
    def _prefill(self, prompts: list[list[int]], cache, state: _Batch,
                 feature_layers: tuple[int, ...] = ()):
        """Run the prompts and pick the first token.

        Returns (padded ids [B, L], lengths [B], first tokens [B], hidden [B, L, H], features of
        ``feature_layers`` or None).
        """
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=self.device)
        width = int(max(len(p) for p in prompts))
        ids = torch.zeros(len(prompts), width, dtype=torch.int64)
        for row, prompt in enumerate(prompts):
            ids[row, :len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
        ids = ids.to(self.device)
        positions = torch.arange(width, device=self.device).expand(len(prompts), -1)
        hidden, features = self.target(ids, positions, cache,
                                       causal_tree_mask(len(prompts), width, self.device),
                                       feature_layers)
        last_hidden = gather_rows(hidden, (lengths - 1).unsqueeze(1)).squeeze(1)
        root = self._accept_root_only(self.target.logits(last_hidden), state,
                                      *self._uniforms(state, 1))
        cache.lens.copy_(lengths.to(torch.int32))
        return ids, lengths, root, hidden, features

    # -------------------------------------------------------------------------- the loops
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 128,
                 sampling: SamplingConfig | None = None, eos_token_ids: Sequence[int] = (),
                 speculative: bool = True, max_length: int | None = None) -> GenerationOutput:
        """Generate for a batch of token-id prompts (different lengths allowed).

        A sequence stops at an EOS token, after ``max_new_tokens``, or when prompt plus output
        reach ``max_length`` (default: the target's ``max_position_embeddings``).
        """
        for _ in self._run(prompts, max_new_tokens, sampling, eos_token_ids, speculative,
                           max_length, emit=False):
            pass
        return self.last_output

    def stream(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 128,
               sampling: SamplingConfig | None = None, eos_token_ids: Sequence[int] = (),
               speculative: bool = True,
               max_length: int | None = None) -> Iterator[list[list[int]]]:
        """Yield, after prefill and after every cycle, each sequence's newly generated tokens.

        When the iterator is exhausted, :attr:`last_output` holds the full
        :class:`GenerationOutput`. Streaming reads the new tokens every cycle (one more small
        host copy than :meth:`generate`).
        """
        yield from self._run(prompts, max_new_tokens, sampling, eos_token_ids, speculative,
                             max_length, emit=True)

    def _run(self, prompts, max_new_tokens, sampling, eos_token_ids, speculative, max_length,
             emit):
        prompts = [list(map(int, p)) for p in prompts]
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: expected at least one non-empty token list")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
        vocab = self.target.vocab_size
        if any(t < 0 or t >= vocab for p in prompts for t in p):
            raise ValueError(f"prompts: token ids must lie in [0, {vocab})")
        if speculative and self.head is None:
            raise ValueError("speculative: no draft head loaded; pass speculative=False")
        max_length = max_length or self.target.config.max_position_embeddings
        budgets = [min(max_new_tokens, max_length - len(p)) for p in prompts]
        self._max_new_tokens = max_new_tokens
        if min(budgets) < 1:
            raise ValueError(f"prompts: a prompt of {max(map(len, prompts))} tokens leaves no "
                             f"room under max_length {max_length}")
        sampling = sampling or SamplingConfig()
        loop = self._speculative if speculative else self._autoregressive
        with torch.inference_mode():
            for counts, state in loop(prompts, budgets, sampling, list(eos_token_ids)):
                if emit:
                    yield self._new_tokens(state, counts)

    @property
    def last_output(self) -> GenerationOutput:
        return self._last_output

    def _start(self, prompts, budgets, sampling, eos, width, extra):
        batch = len(prompts)
        max_len = max(len(p) for p in prompts) + max(budgets) + extra
        state = _Batch(budgets, width, eos, sampling, self.device)
        cache = self.target.allocate_cache(batch, max_len)
        return state, cache

    def _autoregressive(self, prompts, budgets, sampling, eos):
        stats = GenerationStats("autoregressive", accepted_histogram=[0])
        state, cache = self._start(prompts, budgets, sampling, eos, 1, 1)
        start = _now(self.device)
        _, _, root, _, _ = self._prefill(prompts, cache, state)
        counts = state.record(root.unsqueeze(1), torch.ones_like(state.generated))
        stats.prefill_seconds = _now(self.device) - start
        yield counts, state
        ones = torch.ones(len(prompts), 1, 1, dtype=torch.int32, device=self.device)
        step = functools.partial(self._step, cache, state, ones)
        yield from self._decode(step, [root], 1, [cache.lens], state, stats)

    def _step(self, cache, state: _Batch, ones, root, accept_u, bonus_u):
        """One autoregressive step for the whole batch (same model code and ops as a cycle)."""
        active = ~state.done
        positions = cache.lens.to(torch.int64).unsqueeze(1)
        hidden, _ = self.target(root.unsqueeze(1), positions, cache, ones)
        cache.lens += active.to(torch.int32)
        root = self._accept_root_only(self.target.logits(hidden[:, 0]), state, accept_u, bonus_u)
        counts = state.record(root.unsqueeze(1), torch.ones_like(state.generated))
        return root, counts, torch.zeros_like(counts), active.to(torch.int64)

    def _speculative(self, prompts, budgets, sampling, eos):
        tree = self.tree
        width = tree.max_depth + 1
        stats = GenerationStats("speculative", accepted_histogram=[0] * width)
        # Room past prompt + budget: the verify tree (total_tokens), plus max_depth because the
        # cycle that reaches a budget still advances the cache by its whole accepted path, and a
        # finished sequence keeps receiving (ignored) trees while others in the batch run.
        state, cache = self._start(prompts, budgets, sampling, eos, width,
                                   tree.total_tokens + tree.max_depth)
        draft_cache = self.head.allocate_cache(len(prompts), cache.max_len + tree.drafted_keys)
        start = _now(self.device)
        ids, lengths, root, hidden, features = self._prefill(prompts, cache, state,
                                                             self.head.feature_layers)
        counts = state.record(root.unsqueeze(1), torch.ones_like(state.generated))
        # Pairs (feature t, token t + 1): the prompt shifted by one, the first new token last.
        next_tokens = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)
        next_tokens.scatter_(1, (lengths - 1).unsqueeze(1), root.unsqueeze(1))
        root_hidden = commit(self.head, draft_cache, next_tokens,
                             self.head.project(hidden, features), lengths)
        stats.prefill_seconds = _now(self.device) - start
        yield counts, state
        cycle = functools.partial(self._cycle, cache, draft_cache, state)
        yield from self._decode(cycle, [root, root_hidden], tree.total_tokens,
                                [cache.lens, draft_cache.lens], state, stats)

    def _decode(self, step, carry, nodes, lens, state: _Batch, stats: GenerationStats):
        """Run ``step`` until every sequence stops; captured in a CUDA graph where possible.

        ``step(*carry, accept_u, bonus_u)`` returns the next carry, then counts, accepted
        lengths and the active mask. The one host read per cycle copies stop flags and
        accepted lengths together.
        """
        start = _now(self.device)
        finished = bool(state.done.all())
        runner = step
        if not finished and self.cuda_graphs and self.device.type == "cuda":
            mutable = [*lens, state.out, state.generated, state.done]
            graphed, reason = GraphedStep.try_capture(
                step, [*carry, *self._uniforms(state, nodes)], mutable)
            self.graph_status = reason or "captured"
            runner = graphed or step
            stats.capture_seconds = _now(self.device) - start
            start = _now(self.device)  # decode time excludes the one-off capture
        while not finished:
            outputs = runner(*carry, *self._uniforms(state, nodes))
            carry = list(outputs[:len(carry)])
            counts, accepted, active = outputs[len(carry):]
            host = torch.stack([accepted, active, state.done.long()]).cpu()
            finished = bool(host[2].all())
            for n in host[0][host[1].bool()].tolist():
                stats.accepted_histogram[n] += 1
            stats.cycles += 1
            yield counts, state
        stats.decode_seconds = _now(self.device) - start
        self._finish(state, stats)

    def _cycle(self, cache, draft_cache, state: _Batch, root, root_hidden, accept_u, bonus_u):
        """One draft -> verify -> accept -> compact -> commit cycle for the whole batch."""
        tree = draft_tree(self.head, draft_cache, root, root_hidden, self.tree)
        positions = cache.lens.to(torch.int64).unsqueeze(1) + tree.depth
        hidden, features = self.target(tree.tokens, positions, cache, tree.tree_mask,
                                       self.head.feature_layers)
        result = self._accept_tree(tree, self.target.logits(hidden), state, accept_u, bonus_u)
        active = ~state.done
        ops.compact_kv(cache.all_tensors(), cache.lens, result.accepted_nodes,
                       result.num_accepted)
        produced = (result.num_accepted + 1) * active.to(torch.int32)
        cache.lens += produced
        counts = state.record(result.output_tokens, produced)
        nodes = result.accepted_nodes.clamp(min=0).to(torch.int64)
        picked_hidden = gather_rows(hidden, nodes)
        picked_features = None if features is None else gather_rows(features, nodes)
        tokens = result.output_tokens.clamp(min=0)
        root_hidden = commit(self.head, draft_cache, tokens,
                             self.head.project(picked_hidden, picked_features), produced)
        last = (result.num_accepted.to(torch.int64)).unsqueeze(1)
        root = result.output_tokens.gather(1, last).squeeze(1)
        return (root, root_hidden, counts, result.num_accepted.to(torch.int64),
                active.to(torch.int64))

    # --------------------------------------------------------------------------- helpers
    @staticmethod
    def _new_tokens(state: _Batch, counts: torch.Tensor) -> list[list[int]]:
        counts = counts.tolist()
        ends = state.generated.tolist()
        if not any(counts):
            return [[] for _ in counts]
        # Copy only the columns this cycle wrote, not the whole output buffer.
        first = min(e - c for e, c in zip(ends, counts) if c)
        rows = state.out[:, first:max(ends)].tolist()
        return [rows[b][ends[b] - c - first: ends[b] - first] if c else []
                for b, c in enumerate(counts)]

    def _finish(self, state: _Batch, stats: GenerationStats) -> None:
        generated = state.generated.tolist()
        rows = state.out.tolist()
        eos = set(state.eos.tolist())
        tokens = [rows[b][: generated[b]] for b in range(len(generated))]
        budgets = state.budgets.tolist()
        reasons = ["eos" if seq and seq[-1] in eos else
                   "max_length" if len(seq) == budget < self._max_new_tokens else
                   "max_new_tokens" for seq, budget in zip(tokens, budgets)]
        stats.new_tokens = [len(t) for t in tokens]
        self._last_output = GenerationOutput(tokens, reasons, stats)


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
