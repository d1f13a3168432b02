"""The draft -> verify -> accept loop, and the autoregressive baseline on the same code.

:class:`Engine` owns a target model and an optional draft head; each generate or stream call
allocates its own static caches and keeps everything else it needs (settings, device buffers,
random generator, statistics, output) in one per-call object, so calls are independent: a
stream paused between two cycles is unaffected by another call on the same engine. Both modes
share prefill, token selection (the same acceptance ops: greedy argmax, or the target's
temperature / top-k / top-p distribution) and the stop rules (EOS, max new tokens, cache length),
so a speedup compares like with like and greedy speculative output can be checked token for
token against greedy autoregressive output.

One speculative cycle for B sequences, all on the device:
draft tree (:func:`~.drafting.draft_tree`) -> target forward over the N tree nodes with the
packed tree mask -> accept (greedy or rejection sampling) -> move the accepted path's K/V next to
the prefix (:func:`eagle_kernels.ops.compact_kv`) -> feed the accepted features and tokens to
the head (:func:`~.drafting.commit`) -> record the new tokens.

Host reads (what makes a cycle wait for the device; on a CPU they cost nothing):

* the loop itself reads one small tensor per cycle, stop flags and accepted lengths together
  (:meth:`Engine.stream` also copies the cycle's new tokens);
* the ops' value checks (scans of index ranges on the host, see
  :func:`eagle_kernels.ops.value_checks_enabled`) are off inside the loop: its inputs are
  checked once when the call starts, and everything else is made by the ops themselves;
* the ``"torch"`` reference backends read sizes and indices on the host inside the op (tree
  attention reads ``cache_lens`` once per layer, tree construction and the acceptance
  references loop over the batch); the ``"cpu"`` kernels read nothing back (host memory);
* a cycle replayed from a CUDA graph (:mod:`.graphs`; kernel backends only, since capture fails
  on the host reads of the torch backends and the engine then runs eagerly, saying why in
  ``stats.graph_status``) performs none of these: its one host read is the loop's.
"""

from __future__ import annotations

import functools
import numbers
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .. import ops
from ..ops.attention import ORDERED_MAX_TREE_KEYS
from ..ops._backend import cpu_bookkeeping
from ..ops._validate import check_eps, check_int, check_positive, no_value_checks
from .draft_heads import DraftHead
from .drafting import TreeConfig, causal_tree_mask, commit, draft_tree, gather_rows
from .graphs import GraphedStep
from .lookup import LOOKUP_MAX_NGRAM, ContextDrafts, LookupStep, chain_tree, within_drafts
from .model import TargetModel
from .tree_budget import AdaptiveTree


def _token_list(name: str, ids) -> list[int]:
    """``ids`` (a sequence of ints, or a 1-D integer tensor) as a list of int; a float or a
    string is refused, not truncated."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() \
                or ids.dtype == torch.bool:
            raise ValueError(f"{name}: expected a 1-D integer tensor, got {ids.dtype} of shape "
                             f"{list(ids.shape)}")
        return ids.tolist()
    if hasattr(ids, "tolist") and not isinstance(ids, (str, bytes)):  # a NumPy array
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, set, frozenset)):
        raise TypeError(f"{name}: expected a sequence of token ids, got {type(ids).__name__}")
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
    """temperature 0 means greedy; otherwise the target's tempered, top-k/top-p distribution."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        check_eps("temperature", self.temperature)  # a finite number >= 0 (0: greedy)
        check_int("top_k", self.top_k, 0, 2**31 - 1)  # 0: off; an int32 (any vocabulary fits)
        if check_positive("top_p", self.top_p) > 1:
            raise ValueError(f"top_p: expected 0 < top_p <= 1, got {self.top_p}")
        if self.seed is not None:
            check_int("seed", self.seed, -2**63, 2**64 - 1)  # what torch.manual_seed takes

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
    # "captured", or why this call's decode loop ran eagerly (see Engine._graph_plan).
    graph_status: str = "eager (not a CUDA device)"
    tree_cycles: dict[str, int] = field(default_factory=dict)  # "top_k/depth/nodes" -> cycles
    plain_steps: int = 0  # steps of plain decoding in a speculative call (see ``fallback``)
    fallback: str = ""  # why a speculative call decoded plainly, from where
    lookup_steps: int = 0  # plain steps and cycles that verified context drafts (.lookup)
    context_cycles: int = 0  # of those, cycles that verified them in place of the tree
    lookup_accepted: int = 0  # context-drafted tokens accepted (all sequences)
    lookup_pauses: int = 0  # times context drafts lost to plain steps and paused (see .lookup)

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
                "lookup_pauses": self.lookup_pauses}


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
        # A greedy speculative call's context drafts (.lookup), set by Engine._start_call;
        # context_cycle: whether the cycle that just ran verified one instead of a tree.
        self.context: ContextDrafts | None = None
        self.context_cycle = False
        self._state = [t.data_ptr() for t in (self.generated, self.done, self.out, self.budgets,
                                              self.eos)]
        self.rng = None
        if not sampling.greedy:
            self.rng = torch.Generator(device=device)
            self.rng.manual_seed(sampling.seed if sampling.seed is not None else
                                 int(torch.randint(0, 2**62, (1,)).item()))

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


class Engine:
    """Target model + optional draft head; every call allocates its own static caches.

    ``tree`` and ``cuda_graphs`` are settings read when a call starts. Calls keep no state on
    the engine (see :class:`_Call`); :attr:`last_output` and :attr:`graph_status` only report
    the call that finished most recently, for interactive use. With several calls in flight,
    use what each call returns (``generate``'s output, ``stream(...).output``).
    """

    def __init__(self, target: TargetModel, head: DraftHead | None = None,
                 tree: TreeConfig | None = None, cuda_graphs: bool = True,
                 tree_policy: AdaptiveTree | None = None, prompt_lookup: bool = True):
        self.target = target
        self.head = head
        self.tree = tree or TreeConfig()
        self.cuda_graphs = cuda_graphs  # on CUDA devices; CPU always runs eagerly
        # tree="auto": the tree is re-picked between cycles from measured costs and the
        # acceptance observed (eager loops only; a captured CUDA graph keeps one shape). The
        # policy's estimate of acceptance carries over from call to call: it is the head's.
        self.tree_policy = tree_policy
        # Greedy speculative calls also draft from the context, in cycles (eager loops) and
        # in the steps the tree budget decodes plainly (see .lookup): lossless, like every draft.
        self.prompt_lookup = prompt_lookup
        self._last_output: GenerationOutput | None = None

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def last_output(self) -> GenerationOutput | None:
        """Read-only: the output of the call that finished last (None before any). Prefer the
        call's own result when calls may interleave."""
        return self._last_output

    @property
    def graph_status(self) -> str:
        """Read-only: ``stats.graph_status`` of the call that finished last."""
        if self._last_output is None:
            return "no call has finished yet"
        return self._last_output.stats.graph_status

    def _graph_plan(self) -> str | None:
        """None when the decode loop should try CUDA-graph capture, else why it runs eagerly."""
        if self.device.type != "cuda":
            return "eager (not a CUDA device)"
        if not self.cuda_graphs:
            return "eager (cuda_graphs=False)"
        if self.tree_policy is not None:
            return "eager (adaptive tree: one graph per shape is not worth it)"
        return None

    # ----------------------------------------------------------------------- token choice
    def _uniforms(self, call: _Call, nodes: int,
                  draw: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Acceptance uniforms [B, nodes] and bonus uniforms [B] for one cycle.

        Zeros when greedy, and when ``draw`` is False: graph capture only needs tensors of the
        right shapes (their values are copied in at each replay), and drawing them from the
        call's generator would shift its seeded stream, so that the same seed would sample
        differently with and without CUDA graphs.
        """
        if call.sampling.greedy or not draw:
            return call.zero_uniforms(nodes)
        batch = call.out.shape[0]
        return call.uniforms(batch, nodes), call.uniforms(batch)

    def _accept_root_only(self, logits, call: _Call, accept_u, bonus_u) -> torch.Tensor:
        """The next token from last-position logits [B, V]: greedy or sampled, via the ops."""
        batch = logits.shape[0]
        tokens = torch.zeros(batch, 1, dtype=torch.int64, device=logits.device)
        logits = logits.unsqueeze(1)
        if call.sampling.greedy:
            result = ops.greedy_accept_chain(tokens, logits)
        else:
            s = call.sampling
            parents = torch.full((batch, 1), -1, dtype=torch.int32, device=logits.device)
            result = ops.stochastic_accept_tree(tokens, parents, logits, accept_u[:, :1], bonus_u,
                                                0, s.temperature, s.top_k, s.top_p)
        return result.output_tokens[:, 0]

    def _accept_tree(self, tree: ops.DraftTree, logits, call: _Call, accept_u,
                     bonus_u) -> ops.AcceptResult:
        if call.sampling.greedy:
            return ops.greedy_accept_tree(tree.tokens, tree.paths, logits)
        s = call.sampling
        return ops.stochastic_accept_tree(tree.tokens, tree.parents, logits, accept_u, bonus_u,
                                          call.tree.max_depth, s.temperature, s.top_k, s.top_p)

    # --------------------------------------------------------------------------- prefill
    def _prefill(self, prompts: list[list[int]], cache, call: _Call,
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
        root = self._accept_root_only(self.target.logits(last_hidden), call,
                                      *self._uniforms(call, 1))
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
        stream = self._start_call(prompts, max_new_tokens, sampling, eos_token_ids, speculative,
                                  max_length, emit=False)
        with ops.weights_unchanged():  # no caller code runs between the steps of this loop
            for _ in stream:
                pass
        return stream.output

    def stream(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 128,
               sampling: SamplingConfig | None = None, eos_token_ids: Sequence[int] = (),
               speculative: bool = True, max_length: int | None = None) -> GenerationStream:
        """Yield, after prefill and after every cycle, each sequence's newly generated tokens.

        Arguments are checked here, before the first item. When the returned
        :class:`GenerationStream` is exhausted, its ``output`` holds the full
        :class:`GenerationOutput`. Streaming reads the new tokens every cycle (one more small
        host copy than :meth:`generate`).
        """
        return self._start_call(prompts, max_new_tokens, sampling, eos_token_ids, speculative,
                                max_length, emit=True)

    def _start_call(self, prompts, max_new_tokens, sampling, eos_token_ids, speculative,
                    max_length, emit) -> GenerationStream:
        prompts = [_token_list(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: expected at least one non-empty token list")
        eos_token_ids = _token_list("eos_token_ids", eos_token_ids)
        if max_length is not None:
            check_int("max_length (None: the model's limit)", max_length, 2)
        check_int("max_new_tokens", max_new_tokens, 1)
        vocab = self.target.vocab_size
        if any(t < 0 or t >= vocab for p in prompts for t in p):
            raise ValueError(f"prompts: token ids must lie in [0, {vocab})")
        if speculative and self.head is None:
            raise ValueError("speculative: no draft head loaded; pass speculative=False")
        max_length = max_length or self.target.config.max_position_embeddings
        budgets = [min(max_new_tokens, max_length - len(p)) for p in prompts]
        if min(budgets) < 1:
            raise ValueError(f"prompts: a prompt of {max(map(len, prompts))} tokens leaves no "
                             f"room under max_length {max_length}")
        sampling = sampling or SamplingConfig()
        policy = self.tree_policy if speculative else None
        plain_instead = policy is not None and not policy.start_call()
        # A greedy speculative call's plainly decoded steps may verify context drafts.
        lookup = speculative and self.prompt_lookup and sampling.greedy
        tree = self.tree if policy is None else policy.current
        # every tree a speculative call of this engine may use (the largest the policy picks)
        bound = self.tree if self.tree_policy is None else self.tree_policy.largest
        if speculative:
            width = max(bound.max_depth, LOOKUP_MAX_NGRAM if lookup else 0) + 1
            stats = GenerationStats("speculative", accepted_histogram=[0] * (bound.max_depth + 1))
        else:
            width = 1
            stats = GenerationStats("autoregressive", accepted_histogram=[0])
        if plain_instead:  # the head accepts too little for any tree to pay here (see policy)
            speculative, policy = False, None
        # Room past prompt + budget: the verify tree (total_tokens), plus max_depth because the
        # cycle that reaches a budget still advances the cache by its whole accepted path, and
        # a finished sequence keeps receiving (ignored) trees while others in the batch run.
        # Plain calls take the same room: kernels may tile by the cache's capacity (the Triton
        # attention's splits), and plain and speculative calls must compute alike.
        if speculative and self.device.type == "cuda" and bound.total_tokens > \
                ORDERED_MAX_TREE_KEYS:
            warnings.warn(f"tree: {bound.total_tokens} nodes > {ORDERED_MAX_TREE_KEYS} "
                          f"(attention.ORDERED_MAX_TREE_KEYS): the GPU's tree attention is "
                          f"row-invariant only up to that size, so greedy output may differ "
                          f"from plain decoding at near-ties", stacklevel=3)
        # A context draft's chain (LOOKUP_MAX_NGRAM + 1 nodes, a draft never longer than the
        # tokens its row may still record) takes the room of a tree, and its depth.
        room = (max(bound.total_tokens, LOOKUP_MAX_NGRAM + 1)
                + max(bound.max_depth, LOOKUP_MAX_NGRAM))
        max_len = max(map(len, prompts)) + max(budgets) + room
        with torch.inference_mode():  # the per-call buffers, made as the loop's own tensors
            call = _Call(budgets, width, list(eos_token_ids), sampling, tree, max_new_tokens,
                         stats, self.device, policy)
            cache = self.target.allocate_cache(len(prompts), max_len)
        if lookup:
            call.context = ContextDrafts(call, prompts)
        if plain_instead:
            stats.fallback = ("plain decoding" + (" with context drafts" if lookup else "")
                              + ": no tree is expected to beat it at this acceptance")
        if speculative:
            steps = self._speculative(prompts, call, cache)
        else:
            steps = self._autoregressive(prompts, call, cache)
        chunks = (self._new_tokens(call, counts) for counts in steps) if emit else steps
        return GenerationStream(chunks, call)

    def _autoregressive(self, prompts, call: _Call, cache):
        """Plain decoding; in a speculative call the tree budget decodes plainly, with context
        drafts (``call.context``: :class:`~.lookup.LookupStep`)."""
        start = _now(self.device)
        _, _, root, _, _ = self._prefill(prompts, cache, call)
        counts = call.record(root.unsqueeze(1), torch.ones_like(call.generated))
        call.stats.prefill_seconds = _now(self.device) - start
        yield counts
        step = self._plain_step(prompts, call, cache)
        # a speculative call decoding plainly counts plain steps (not cycles of a tree)
        plain = step if call.stats.mode == "speculative" else None
        yield from self._decode(step, [root], 1, [cache.lens], call, plain_step=plain)

    def _plain_step(self, prompts, call: _Call, cache):
        ones = torch.ones(len(prompts), 1, 1, dtype=torch.int32, device=self.device)
        step = functools.partial(self._step, cache, call, ones)
        if call.context is None:
            return step
        return LookupStep(self.target, cache, call, call.context, step)

    def _step(self, cache, call: _Call, ones, root, accept_u, bonus_u):
        """One autoregressive step for the whole batch (same model code and ops as a cycle)."""
        positions = cache.lens.to(torch.int64).unsqueeze(1)
        hidden, _ = self.target(root.unsqueeze(1), positions, cache, ones)
        logits = self.target.logits(hidden[:, 0])
        if call.native is not None and call.sampling.greedy and logits.dtype == torch.float32:
            root, counts, active = call.greedy_step(logits, cache.lens)  # one C++ call on CPU
            return root, counts, torch.zeros_like(counts), active
        active = ~call.done
        cache.lens += active.to(torch.int32)
        root = self._accept_root_only(logits, call, accept_u, bonus_u)
        counts = call.record(root.unsqueeze(1), torch.ones_like(call.generated))
        return root, counts, torch.zeros_like(counts), active.to(torch.int64)

    def _speculative(self, prompts, call: _Call, cache):
        head, tree = self.head, call.tree
        bound = tree if call.policy is None else call.policy.largest
        draft_cache = head.allocate_cache(len(prompts), cache.max_len + bound.drafted_keys)
        start = _now(self.device)
        ids, lengths, root, hidden, features = self._prefill(prompts, cache, call,
                                                             head.feature_layers)
        counts = call.record(root.unsqueeze(1), torch.ones_like(call.generated))
        # Pairs (feature t, token t + 1): the prompt shifted by one, the first new token last.
        next_tokens = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)
        next_tokens.scatter_(1, (lengths - 1).unsqueeze(1), root.unsqueeze(1))
        root_hidden = commit(head, draft_cache, next_tokens, head.project(hidden, features),
                             lengths)
        call.stats.prefill_seconds = _now(self.device) - start
        yield counts
        # Cycles take context drafts only where the loop runs eagerly (not a captured graph).
        context = call.context if self._graph_plan() is not None else None
        cycle = functools.partial(self._cycle, head, cache, draft_cache, call, context)
        plain_step = self._plain_step(prompts, call, cache)
        yield from self._decode(cycle, [root, root_hidden], tree.total_tokens,
                                [cache.lens, draft_cache.lens], call, plain_step)

    def _decode(self, step, carry, nodes, lens, call: _Call, plain_step=None):
        """Run ``step`` until every sequence stops; captured in a CUDA graph where possible.

        ``step(*carry, accept_u, bonus_u)`` returns the next carry, then counts, accepted
        lengths and the active mask. The loop's one host read per cycle copies stop flags and
        accepted lengths together. ``plain_step`` (speculative calls with an adaptive tree): an
        autoregressive step over the same target cache, taken over for the rest of the call
        when the policy finds that no tree beats plain decoding at the acceptance it observed
        (the bonus token a cycle leaves is exactly the token a plain step starts from).
        """
        stats = call.stats
        start = _now(self.device)
        finished = bool(call.done.all())
        runner = step
        stats.graph_status = self._graph_plan() or (
            "eager (context drafts are proposed on the host)" if isinstance(step, LookupStep)
            else "captured")
        if not finished and stats.graph_status == "captured":
            mutable = [*lens, call.out, call.generated, call.done]
            # Placeholder uniforms (draw=False): capture must not consume the call's seeded
            # random stream, or graphed and eager runs of one seed would sample differently.
            graphed, reason = GraphedStep.try_capture(
                step, [*carry, *self._uniforms(call, nodes, draw=False)], mutable)
            stats.graph_status = reason or "captured"
            runner = graphed or step
            stats.capture_seconds = _now(self.device) - start
            start = _now(self.device)  # decode time excludes the one-off capture
        adaptive = call.policy is not None
        timer = self.tree_policy  # the wall clock of each step / cycle feeds the tree budget
        batch = len(carry[0])
        while not finished:
            if adaptive:
                nodes = call.tree.total_tokens
            began = time.perf_counter()
            outputs = runner(*carry, *self._uniforms(call, nodes))
            carry = list(outputs[:len(carry)])
            counts, accepted, active = outputs[len(carry):]
            # One host read per cycle: on a GPU one copy of the three vectors; on CPU three
            # lists (a stack, a copy and indexing would cost ~10 tensor ops inside the loop).
            rows = (torch.stack([accepted, active, call.done.long()]).tolist()
                    if accepted.is_cuda else [accepted.tolist(), active.tolist(),
                                              call.done.tolist()])
            seconds = time.perf_counter() - began  # the host read above waited for the device
            finished = all(rows[2])
            stats.cycles += 1
            plain = runner is plain_step or stats.mode == "autoregressive"
            # A step or cycle that verified a context draft is neither a plain step nor a
            # cycle of the tree: the tree budget learns nothing from it.
            context = not plain and call.context_cycle
            if timer is not None and plain:
                if getattr(runner, "last_was_plain", True):
                    timer.time_step(seconds, batch)
            elif timer is not None and not context:
                timer.time_cycle(call.tree, seconds, batch)
            if runner is plain_step:
                stats.plain_steps += 1
                yield counts
                continue
            if context:
                yield counts
                continue
            accepted_counts = [n for n, on in zip(rows[0], rows[1]) if on]
            for n in accepted_counts:
                stats.accepted_histogram[n] += 1
            if stats.mode == "speculative":
                name = f"{call.tree.top_k}/{call.tree.depth}/{call.tree.total_tokens}"
                stats.tree_cycles[name] = stats.tree_cycles.get(name, 0) + 1
            if adaptive:  # eager only (see _graph_plan)
                call.policy.observe(call.tree, accepted_counts)
                call.tree = call.policy.current
                if (plain_step is not None and call.policy.just_repicked
                        and not call.policy.worth_speculating()):
                    runner, carry, nodes, adaptive = plain_step, carry[:1], 1, False
                    stats.fallback = (f"plain decoding from cycle {stats.cycles}: no tree is "
                                      f"expected to beat it at alpha "
                                      f"{call.policy.alpha():.2f}")
            yield counts
        stats.decode_seconds = _now(self.device) - start
        self._finish(call)

    def _cycle(self, head: DraftHead, cache, draft_cache, call: _Call,
               context: ContextDrafts | None, root, root_hidden, accept_u, bonus_u):
        """One draft -> verify -> accept -> compact -> commit cycle for the whole batch. With
        ``context``, a cycle whose sequences have context drafts verifies those chains instead
        of drafting a tree (greedy acceptance, cut to each row's own draft)."""
        drafts = context.propose(in_cycle=True) if context is not None else []
        call.context_cycle = any(drafts)
        if call.context_cycle:
            call.stats.context_cycles += 1
            tree = chain_tree(root, drafts)
        else:
            tree = draft_tree(head, draft_cache, root, root_hidden, call.tree)
        positions = cache.lens.to(torch.int64).unsqueeze(1) + tree.depth
        hidden, features = self.target(tree.tokens, positions, cache, tree.tree_mask,
                                       head.feature_layers)
        result = self._accept_tree(tree, self.target.logits(hidden), call, accept_u, bonus_u)
        if call.context_cycle:
            result = within_drafts(result, drafts)
        active = ~call.done
        ops.compact_kv(cache.all_tensors(), cache.lens, result.accepted_nodes,
                       result.num_accepted)
        produced = (result.num_accepted + 1) * active.to(torch.int32)
        cache.lens += produced
        counts = call.record(result.output_tokens, produced)
        nodes = result.accepted_nodes.clamp(min=0).to(torch.int64)
        picked_hidden = gather_rows(hidden, nodes)
        picked_features = None if features is None else gather_rows(features, nodes)
        tokens = result.output_tokens.clamp(min=0)
        root_hidden = commit(head, draft_cache, tokens,
                             head.project(picked_hidden, picked_features), produced)
        last = (result.num_accepted.to(torch.int64)).unsqueeze(1)
        root = result.output_tokens.gather(1, last).squeeze(1)
        if context is not None:
            context.observe(drafts, result.output_tokens, counts, result.num_accepted)
        return (root, root_hidden, counts, result.num_accepted.to(torch.int64),
                active.to(torch.int64))

    # --------------------------------------------------------------------------- helpers
    @staticmethod
    def _new_tokens(call: _Call, counts: torch.Tensor) -> list[list[int]]:
        counts = counts.tolist()
        ends = call.generated.tolist()
        if not any(counts):
            return [[] for _ in counts]
        # Copy only the columns this cycle wrote, not the whole output buffer.
        first = min(e - c for e, c in zip(ends, counts) if c)
        rows = call.out[:, first:max(ends)].tolist()
        return [rows[b][ends[b] - c - first: ends[b] - first] if c else []
                for b, c in enumerate(counts)]

    def _finish(self, call: _Call) -> None:
        generated = call.generated.tolist()
        rows = call.out.tolist()
        eos = set(call.eos.tolist())
        tokens = [rows[b][: generated[b]] for b in range(len(generated))]
        budgets = call.budgets.tolist()
        reasons = ["eos" if seq and seq[-1] in eos else
                   "max_length" if len(seq) == budget < call.max_new_tokens else
                   "max_new_tokens" for seq, budget in zip(tokens, budgets)]
        call.stats.new_tokens = [len(t) for t in tokens]
        call.output = GenerationOutput(tokens, reasons, call.stats)
        self._last_output = call.output  # a report of the last finished call, never read here


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
