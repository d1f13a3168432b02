"""What one generate / stream call owns and returns: sampling settings, statistics, output,
the per-call state (:class:`_Call`: device buffers, stop flags, random generator, context
drafts) and the stream that yields a call's tokens. The loops that fill them are in
:mod:`.generation`.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .. import ops
from ..ops._backend import cpu_bookkeeping
from ..ops._validate import check_eps, check_int, check_positive, no_value_checks
from .drafting import TreeConfig
from .lookup import ContextDrafts
from .tree_budget import AdaptiveTree

# The smallest temperature > 0 a call samples at. logits / temperature must stay finite in
# fp32 (a subnormal 1e-40 sent every logit to +-inf: NaN probabilities, token 0 every step,
# and the loop runs with the ops' value checks off, so nothing said so); at 1e-6 any logit of
# magnitude below 3.4e32 does, far beyond real ones. Below it sampling is greedy in all but
# exact ties anyway: temperature 0 asks for greedy.
MIN_TEMPERATURE = 1e-6


def _token_list(name: str, ids, ordered: bool = True) -> list[int]:
    """``ids`` (a sequence of ints, or a 1-D integer tensor) as a list of int; a float or a
    string is refused, not truncated; a set only where order does not matter (not ``ordered``:
    EOS ids; a prompt's order is its meaning, and a set's is arbitrary)."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() \
                or ids.dtype == torch.bool:
            raise ValueError(f"{name}: expected a 1-D integer tensor, got {ids.dtype} of shape "
                             f"{list(ids.shape)}")
        return ids.tolist()
    if hasattr(ids, "tolist") and not isinstance(ids, (str, bytes)):  # a NumPy array
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, Set)) or (
            ordered and isinstance(ids, Set)):
        kind = "a sequence" if ordered else "a sequence or a set"
        raise TypeError(f"{name}: expected {kind} of token ids, got {type(ids).__name__}")
    if all(type(token) is int for token in ids):  # the common case, checked fast
        return list(ids)
    for index, token in enumerate(ids):
        if isinstance(token, torch.Tensor) and token.dim() == 0 and not (
                token.is_floating_point() or token.is_complex() or token.dtype == torch.bool):
            continue  # list(tensor) gives 0-d integer tensors
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise TypeError(f"{name}[{index}]: expected an int token id, got "
                            f"{type(token).__name__}")
    return [int(token) for token in ids]


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; otherwise (at least :data:`MIN_TEMPERATURE`) the target's
    tempered, top-k/top-p distribution."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        check_eps("temperature", self.temperature)  # a finite number >= 0 (0: greedy)
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature: expected 0 (greedy) or >= {MIN_TEMPERATURE:g} "
                             f"(logits / temperature must stay finite), got "
                             f"{self.temperature!r}")
        check_int("top_k", self.top_k, 0, 2**31 - 1)  # 0: off; an int32 (any vocabulary fits)
        if check_positive("top_p", self.top_p) > 1:
            raise ValueError(f"top_p: expected 0 < top_p <= 1, got {self.top_p}")
        if self.seed is not None:
            check_int("seed", self.seed, -2**63, 2**64 - 1)  # what torch.manual_seed takes

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def of(cls, sampling) -> "SamplingConfig":
        """``sampling`` as a call takes it: a SamplingConfig, or None for greedy decoding."""
        if sampling is None:
            return cls()
        if not isinstance(sampling, cls):  # 0 or {} must not read as greedy
            raise TypeError(f"sampling: expected a SamplingConfig or None (greedy), got "
                            f"{type(sampling).__name__}")
        return sampling


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
    # "captured", or why this call's decode loop ran eagerly (see Engine._graph_plan).
    graph_status: str = "eager (not a CUDA device)"
    tree_cycles: dict[str, int] = field(default_factory=dict)  # "top_k/depth/nodes" -> cycles
    plain_steps: int = 0  # steps of plain decoding in a speculative call (see ``fallback``)
    fallback: str = ""  # why a speculative call decoded plainly, from where
    # context drafts (.lookup) and, in plain steps, the reply store's (.reply_store)
    lookup_steps: int = 0  # plain steps and cycles that verified drafts of either kind
    context_cycles: int = 0  # of those, cycles that verified them in place of the tree
    lookup_accepted: int = 0  # drafted tokens of either kind accepted (all sequences)
    lookup_pauses: int = 0  # times the drafts lost to plain steps and paused (see .lookup)
    store_steps: int = 0  # of lookup_steps, those where some row's draft was the store's
    store_accepted: int = 0  # of lookup_accepted, the store's tokens

    @property
    def tau(self) -> float:
        """Mean tokens per cycle per sequence (accepted draft tokens + 1) over the cycles of a
        tree (plain steps, with or without context drafts, not included); 1.0 without any."""
        cycles = sum(self.accepted_histogram)
        if not cycles:
            return 1.0
        return sum((n + 1) * c for n, c in enumerate(self.accepted_histogram)) / cycles

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
                "capture_seconds": round(self.capture_seconds, 4),
                "graph_status": self.graph_status, "tree_cycles": self.tree_cycles,
                "plain_steps": self.plain_steps, "fallback": self.fallback,
                "lookup_steps": self.lookup_steps, "context_cycles": self.context_cycles,
                "lookup_accepted": self.lookup_accepted,
                "lookup_pauses": self.lookup_pauses, "store_steps": self.store_steps,
                "store_accepted": self.store_accepted}


@dataclass
class GenerationOutput:
    tokens: list[list[int]]
    stop_reasons: list[str]
    stats: GenerationStats


class _Call:
    """Everything one generate / stream call owns: its settings, device buffers (output,
    counters, stop flags), its sampling generator, its statistics and, once finished, its output.

    It lives in the call, never on the :class:`Engine`, so that calls are independent and
    re-entrant (a paused stream and a second call on the same engine do not see each other).
    """

    def __init__(self, budgets: list[int], width: int, eos: Sequence[int],
                 sampling: SamplingConfig, tree: TreeConfig, max_new_tokens: int,
                 stats: GenerationStats, device: torch.device,
                 policy: AdaptiveTree | None = None):
        batch = len(budgets)
        self.out = torch.full((batch, max(budgets) + width), -1, dtype=torch.int64,
                              device=device)
        self.generated = torch.zeros(batch, dtype=torch.int64, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.eos = torch.tensor(sorted(set(eos)) or [-1], dtype=torch.int64, device=device)
        self.budgets = torch.tensor(budgets, dtype=torch.int64, device=device)
        self.sampling = sampling
        self.tree = tree  # a snapshot: reassigning Engine.tree mid-stream changes nothing here
        self.policy = policy  # when set, re-picks self.tree between cycles (AdaptiveTree)
        self.max_new_tokens = max_new_tokens
        self.stats = stats
        self.output: GenerationOutput | None = None
        self._step_columns: dict[int, torch.Tensor] = {}  # see _steps
        self._zero_uniforms: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # see uniforms
        # On CPU one C++ call does record()'s dozen tensor ops (each costs 10-20 us inside the
        # loop, where every step's weight stream has evicted the interpreter's working set).
        self.native = cpu_bookkeeping(self.out.device)
        # A speculative call's context drafts (.lookup), set by Engine._start_call;
        # context_cycle: whether the cycle that just ran verified one instead of a tree.
        self.context: ContextDrafts | None = None
        self.context_cycle = False
        # The engine's settings this call runs with, set by Engine._start_call when the call
        # starts: a stream's loop is a generator, and read at its first next() they would be
        # whatever set_tree (or a new head) made them in between. The draft head (speculative
        # calls); why the loop runs eagerly (None: capture it in a CUDA graph); whether cycles
        # may verify context drafts (eager loops only); the tree budget timing its steps.
        self.head = None
        self.graph_plan: str | None = "eager (not a CUDA device)"
        self.cycle_context = False
        self.timer: AdaptiveTree | None = None
        self._state = [t.data_ptr() for t in (self.generated, self.done, self.out, self.budgets,
                                              self.eos)]
        self.rng = None
        if not sampling.greedy:
            self.rng = torch.Generator(device=device)
            # seed None: fresh entropy from the OS, not from torch's global generator, whose
            # stream the caller's own draws would see shifted by every call
            self.rng.manual_seed(sampling.seed if sampling.seed is not None else
                                 int.from_bytes(os.urandom(8), "little"))

    def record(self, new_tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Append the first ``counts[b]`` of ``new_tokens`` [B, W]; cut at EOS and the budget.

        Returns the counts actually recorded (0 for finished sequences).
        """
        if self.native is not None:
            new_tokens = new_tokens.contiguous()
            counts = counts.to(torch.int64).contiguous()
            recorded = torch.empty_like(self.generated)
            self.native.record_tokens(new_tokens.data_ptr(), counts.data_ptr(),
                                      recorded.data_ptr(), self._state, len(recorded),
                                      new_tokens.shape[1], self.out.shape[1], len(self.eos))
            return recorded
        steps = self._steps(new_tokens.shape[1])
        counts = torch.where(self.done, 0, counts.to(torch.int64))
        is_eos = (steps < counts.unsqueeze(1)) & torch.isin(new_tokens, self.eos)
        hit_eos = is_eos.any(1)
        counts = torch.where(hit_eos, is_eos.int().argmax(1) + 1, counts)
        counts = torch.minimum(counts, self.budgets - self.generated)
        # Columns past a row's count keep what they hold (gather / scatter: cheaper per cycle
        # than advanced indexing, and the buffer has room for a whole last cycle).
        columns = self.generated.unsqueeze(1) + steps
        kept = torch.where(steps < counts.unsqueeze(1), new_tokens, self.out.gather(1, columns))
        self.out.scatter_(1, columns, kept)
        self.generated += counts
        self.done |= hit_eos | (self.generated >= self.budgets)
        return counts

    def _steps(self, width: int) -> torch.Tensor:
        """[1, width] int64 0..width-1, made once per width a call records."""
        steps = self._step_columns.get(width)
        if steps is None:
            steps = torch.arange(width, device=self.out.device).unsqueeze(0)
            self._step_columns[width] = steps
        return steps

    def greedy_step(self, logits: torch.Tensor, lens: torch.Tensor):
        """The greedy step's root = argmax(logits [B, V]), active rows, lens += active and
        record(root) in one C++ call (``self.native`` only): (root, counts, active) [B] int64."""
        batch, vocab = logits.shape
        root, recorded, active = (torch.empty_like(self.generated) for _ in range(3))
        self.native.greedy_step(logits.contiguous().data_ptr(), lens.data_ptr(), root.data_ptr(),
                                active.data_ptr(), recorded.data_ptr(), self._state, batch,
                                vocab, self.out.shape[1], len(self.eos))
        return root, recorded, active

    def accept(self, tree: ops.DraftTree, logits: torch.Tensor, accept_u, bonus_u,
               max_depth: int) -> ops.AcceptResult:
        """Verify a tree against the target's logits [B, N, V] as this call picks tokens:
        greedy (the uniforms unused) or rejection sampling with ``accept_u`` [B, N] and
        ``bonus_u`` [B]; output width ``max_depth + 1``."""
        if self.sampling.greedy:
            return ops.greedy_accept_tree(tree.tokens, tree.paths, logits)
        s = self.sampling
        return ops.stochastic_accept_tree(tree.tokens, tree.parents, logits, accept_u, bonus_u,
                                          max_depth, s.temperature, s.top_k, s.top_p)

    def uniforms(self, *shape) -> torch.Tensor:
        return torch.rand(*shape, generator=self.rng, device=self.out.device)

    def zero_uniforms(self, nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeros [B, nodes] and [B], made once per width (nothing writes them: greedy
        acceptance ignores its uniforms, and a graph copies them into its own inputs)."""
        zeros = self._zero_uniforms.get(nodes)
        if zeros is None:
            batch = self.out.shape[0]
            zeros = (torch.zeros(batch, nodes, device=self.out.device),
                     torch.zeros(batch, device=self.out.device))
            self._zero_uniforms[nodes] = zeros
        return zeros


class GenerationStream:
    """The iterator :meth:`Engine.stream` returns: one item per prefill / cycle, each sequence's
    newly generated tokens; :attr:`output` holds the call's :class:`GenerationOutput` once the
    iterator is exhausted.

    Every step runs under ``torch.inference_mode`` and with the ops' value checks off, both
    entered and left around each ``next`` rather than held across yields, so the caller's own
    modes are untouched between items. Value checks are off because everything the loop feeds
    the ops is either checked once at the call's start (prompts, settings) or made by the ops
    themselves; the scans would cost host time (and a sync per op on a GPU) every cycle.
    """

    def __init__(self, chunks: Iterator[list[list[int]]], call: _Call):
        self._chunks, self._call = chunks, call

    def __iter__(self) -> "GenerationStream":
        return self

    def __next__(self) -> list[list[int]]:
        # weights_unchanged: within one item (a cycle's several head calls) nothing else runs;
        # between items the caller may change weights, and the next item sees it (unless the
        # caller holds a weights_unchanged block of its own around the stream).
        with torch.inference_mode(), no_value_checks(), ops.weights_unchanged():
            return next(self._chunks)

    @property
    def output(self) -> GenerationOutput:
        if self._call.output is None:
            raise RuntimeError("output: available once the stream is exhausted")
        return self._call.output
