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
import time
import warnings
from collections.abc import Set as AbstractSet
from typing import Sequence

import torch

from .. import ops
from ..ops.attention_triton import ORDERED_MAX_TREE_KEYS
from ..ops._validate import check_int
from .calls import (GenerationOutput, GenerationStats, GenerationStream, SamplingConfig, _Call,
                    _token_list)
from .draft_heads import DraftHead
from .drafting import TreeConfig, causal_tree_mask, commit, draft_tree, gather_rows
from .graphs import GraphedStep
from .lookup import (LOOKUP_MAX_NGRAM, ContextDrafts, LookupStep, accept_chain, chain_tree,
                     within_drafts)
from .model import TargetModel, sliding_window
from .reply_store import ReplyStore
from .tree_budget import AdaptiveTree


class Engine:
    """Target model + optional draft head; every call allocates its own static caches.

    ``head``, ``tree``, ``tree_policy``, ``cuda_graphs``, ``prompt_lookup`` and ``reply_store``
    are settings read when a call starts (``stream`` included: changing them before its first
    item changes nothing for that call, see :class:`_Call`). Calls keep no state on the engine;
    :attr:`last_output` and :attr:`graph_status` only report the call that finished most
    recently, for interactive use. With several calls in flight, use what each call returns
    (``generate``'s output, ``stream(...).output``).
    """

    def __init__(self, target: TargetModel, head: DraftHead | None = None,
                 tree: TreeConfig | None = None, cuda_graphs: bool = True,
                 tree_policy: AdaptiveTree | None = None, prompt_lookup: bool = True,
                 reply_store: ReplyStore | None = None):
        self.target = target
        self.head = head
        self.tree = tree or TreeConfig()
        self.cuda_graphs = cuda_graphs  # on CUDA devices; CPU always runs eagerly
        # tree="auto": the tree is re-picked between cycles from measured costs and the
        # acceptance observed (eager loops only; a captured CUDA graph keeps one shape). The
        # policy's estimate of acceptance carries over from call to call: it is the head's.
        self.tree_policy = tree_policy
        # Speculative calls also draft from the context, in cycles (eager loops) and in the
        # steps the tree budget decodes plainly (see .lookup): lossless, like every draft.
        self.prompt_lookup = prompt_lookup
        # With prompt_lookup, a plain step without a context draft may draft from the target's
        # own earlier replies (see .reply_store).
        self.reply_store = reply_store
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

    def _graph_plan(self, cuda_graphs: bool | None = None) -> str | None:
        """None when the decode loop should try CUDA-graph capture, else why it runs eagerly
        (``cuda_graphs``: the plan with that setting instead of the engine's)."""
        if self.device.type != "cuda":
            return "eager (not a CUDA device)"
        if not (self.cuda_graphs if cuda_graphs is None else cuda_graphs):
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
        reach ``max_length`` (default: the target's ``max_position_embeddings``, or its sliding
        window where that is smaller: sliding-window attention is not implemented, so a call
        that could pass the window is refused; one past max_position_embeddings warns).
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
        prompts, eos_token_ids, sampling = self._checked_inputs(prompts, eos_token_ids,
                                                                 sampling, speculative)
        budgets = self._budgets(prompts, max_new_tokens, max_length)
        policy = self.tree_policy  # the engine's settings are read here, once (see _Call)
        # every tree a speculative call of this engine may use (the largest the policy picks)
        bound = self.tree if policy is None else policy.largest
        # A speculative call's plainly decoded steps (and eager cycles) may verify context drafts.
        lookup = speculative and self.prompt_lookup
        if speculative:
            width = max(bound.max_depth, LOOKUP_MAX_NGRAM if lookup else 0) + 1
            stats = GenerationStats("speculative", accepted_histogram=[0] * (bound.max_depth + 1))
        else:
            width = 1
            stats = GenerationStats("autoregressive", accepted_histogram=[0])
        # Room past prompt + budget: the verify tree (total_tokens), plus max_depth because the
        # cycle that reaches a budget still advances the cache by its whole accepted path, and
        # a finished sequence keeps receiving (ignored) trees while others in the batch run.
        # Plain calls take the same room: kernels may tile by the cache's capacity (the Triton
        # attention's splits), and plain and speculative calls must compute alike.
        # A context draft's chain (LOOKUP_MAX_NGRAM + 1 nodes, a draft never longer than the
        # tokens its row may still record) takes the room of a tree, and its depth.
        room = (max(bound.total_tokens, LOOKUP_MAX_NGRAM + 1)
                + max(bound.max_depth, LOOKUP_MAX_NGRAM))
        max_len = max(map(len, prompts)) + max(budgets) + room
        with torch.inference_mode():  # the per-call buffers, made as the loop's own tensors
            # recorded tokens come from positions below prompt + budget (see allocate_cache);
            # the cache first: the largest, refused with a clear error where it cannot fit
            cache = self.target.allocate_cache(len(prompts), max_len,
                                               used=max(map(len, prompts)) + max(budgets))
            call = _Call(budgets, width, list(eos_token_ids), sampling, self.tree,
                         max_new_tokens, stats, self.device)
        # Only now, the call's buffers made, does it touch the shared tree budget: a call
        # refused above (bad input, no memory) leaves the policy as it was.
        if speculative and policy is not None:
            speculative = policy.start_call(len(prompts))
            if speculative:
                call.policy, call.tree = policy, policy.current
            else:  # the head accepts too little for any tree to pay here (see policy)
                stats.fallback = ("plain decoding" + (" with context drafts" if lookup else "")
                                  + ": no tree is expected to beat it at this acceptance")
        if speculative and self.device.type == "cuda" and bound.total_tokens > \
                ORDERED_MAX_TREE_KEYS:
            warnings.warn(f"tree: {bound.total_tokens} nodes > {ORDERED_MAX_TREE_KEYS} "
                          f"(attention_triton.ORDERED_MAX_TREE_KEYS): the GPU's tree attention is "
                          f"row-invariant only up to that size, so greedy output may differ "
                          f"from plain decoding at near-ties", stacklevel=3)
        self._settle(call, prompts, speculative, lookup, policy)
        if speculative:
            steps = self._speculative(prompts, call, cache)
        else:
            steps = self._autoregressive(prompts, call, cache)
        chunks = (self._new_tokens(call, counts) for counts in steps) if emit else steps
        return GenerationStream(chunks, call)

    def _check_settings(self) -> None:
        """The engine's settings, read when a call starts (they may be set at any time): each
        of its type, and a head made for this target."""
        if not isinstance(self.target, TargetModel):
            raise TypeError(f"target: expected a TargetModel (eagle_kernels.runtime.model), got "
                            f"{type(self.target).__name__}")
        if self.head is not None:
            if not isinstance(self.head, DraftHead):
                raise TypeError(f"head: expected a DraftHead or None, got "
                                f"{type(self.head).__name__}")
            if self.head._target[0] is not self.target:
                raise ValueError("head: expected a head loaded for this engine's target (it "
                                 "drafts with its target's embedding and lm_head), got one "
                                 "loaded for another target")
        if not isinstance(self.tree, TreeConfig):
            raise TypeError(f"tree: expected a TreeConfig, got {type(self.tree).__name__}")
        if self.tree_policy is not None and not isinstance(self.tree_policy, AdaptiveTree):
            raise TypeError(f"tree_policy: expected an AdaptiveTree or None, got "
                            f"{type(self.tree_policy).__name__}")
        for name in ("cuda_graphs", "prompt_lookup"):  # "no" would read as True
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected a bool, got "
                                f"{type(getattr(self, name)).__name__}")

    def _checked_inputs(self, prompts, eos_token_ids, sampling, speculative):
        """The call's prompts and EOS ids as lists of int, and its SamplingConfig; a bad one
        refused by name."""
        self._check_settings()
        if isinstance(prompts, (AbstractSet, str, bytes)) or not (
                isinstance(prompts, (Sequence, torch.Tensor)) or hasattr(prompts, "tolist")):
            # a set: its order, which tells the outputs apart, is arbitrary; a NumPy array is
            # rows of ids
            raise TypeError(f"prompts: expected a sequence of token lists, got "
                            f"{type(prompts).__name__}")
        prompts = [_token_list(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
        if not prompts:
            raise ValueError("prompts: expected at least one non-empty token list, got none")
        empty = [i for i, p in enumerate(prompts) if not p]
        if empty:
            raise ValueError(f"prompts[{empty[0]}]: expected a non-empty token list, got []")
        eos_token_ids = _token_list("eos_token_ids", eos_token_ids, ordered=False)
        vocab = self.target.vocab_size
        for name, ids in [*((f"prompts[{i}]", p) for i, p in enumerate(prompts)),
                          ("eos_token_ids", eos_token_ids)]:
            bad = next((j for j, t in enumerate(ids) if not 0 <= t < vocab), None)
            if bad is not None:
                raise ValueError(f"{name}: expected token ids in [0, {vocab}), got {ids[bad]} "
                                 f"at index {bad}")
        self._check_reply_store(vocab)
        if not isinstance(speculative, bool):  # "no" would read as True
            raise TypeError(f"speculative: expected a bool, got {type(speculative).__name__}")
        if speculative and self.head is None:
            raise ValueError("speculative: no draft head loaded; pass speculative=False")
        return prompts, eos_token_ids, SamplingConfig.of(sampling)

    def _check_reply_store(self, vocab: int) -> None:
        """The engine's reply store: None or a ReplyStore of the target's vocabulary (its
        drafts are token ids the target embeds)."""
        store = self.reply_store
        if store is not None and not isinstance(store, ReplyStore):
            raise TypeError(f"reply_store: expected a ReplyStore or None, got "
                            f"{type(store).__name__}")
        if store is not None and store.vocab_size != vocab:
            raise ValueError(f"reply_store: expected a store of the target's {vocab}-token "
                             f"vocabulary, got one of {store.vocab_size}")

    def _budgets(self, prompts, max_new_tokens, max_length) -> list[int]:
        """Each sequence's new tokens under ``max_length`` (None: the target's limit, the
        smaller of max_position_embeddings and an active sliding window). Past the window the
        call is refused (sliding-window attention is not implemented); past
        max_position_embeddings it runs, with a warning (RoPE computes any position, and YaRN
        configs keep the unscaled limit there; transformers warns alike)."""
        check_int("max_new_tokens", max_new_tokens, 1)
        if max_length is not None:
            check_int("max_length (None: the model's limit)", max_length, 2)
        positions = getattr(self.target.config, "max_position_embeddings", None)
        window = sliding_window(self.target.config)
        limits = [n for n in (positions, window) if n is not None]
        if max_length is None and not limits:
            raise ValueError("max_length: expected an int, the target's config sets no "
                             "max_position_embeddings, got None")
        limit = max_length or min(limits)
        budgets = [min(max_new_tokens, limit - len(p)) for p in prompts]
        if min(budgets) < 1:
            raise ValueError(f"prompts: a prompt of {max(map(len, prompts))} tokens leaves no "
                             f"room under max_length {limit}"
                             + ("" if max_length else " (the target's limit)"))
        end = max(len(p) + budget for p, budget in zip(prompts, budgets))
        if window is not None and end > window:
            raise ValueError(f"max_length: expected <= {window}, the target's sliding_window "
                             f"(sliding-window attention is not implemented; prompt + "
                             f"max_new_tokens reach {end}), got {max_length}")
        if positions is not None and end > positions:
            warnings.warn(f"max_length: {max_length} lets prompt + new tokens reach {end} "
                          f"positions, past the target's max_position_embeddings {positions} "
                          f"(output there may degrade)", stacklevel=4)
        return budgets

    def _settle(self, call: _Call, prompts, speculative: bool, lookup: bool, policy) -> None:
        """Fix on ``call`` the engine settings its loop reads (see _Call)."""
        call.head = self.head if speculative else None
        call.timer = policy  # the wall clock of each step / cycle feeds the tree budget
        call.graph_plan = self._graph_plan()
        # Cycles take context drafts only where the loop runs eagerly (not a captured graph);
        # a sampling call's only where it would run eagerly with cuda_graphs on too (a context
        # cycle draws its own uniforms, and one seed must sample alike with and without graphs).
        call.cycle_context = lookup and self._graph_plan(
            None if call.sampling.greedy else True) is not None
        if lookup:
            call.context = ContextDrafts(call, prompts, verify_steps=getattr(
                policy, "verify_steps", None), store=self.reply_store)

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
        head, tree = call.head, call.tree
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
        context = call.context if call.cycle_context else None  # see _settle
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
        stats.graph_status = call.graph_plan or (
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
        timer = call.timer
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
                call.policy.observe(call.tree, accepted_counts, batch)
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
        of drafting a tree (accepted as a plain step's chain would be, cut to each row's own
        draft)."""
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
        logits = self.target.logits(hidden)
        if call.context_cycle:
            result = within_drafts(accept_chain(tree, logits, call, bonus_u), drafts)
        else:
            result = call.accept(tree, logits, accept_u, bonus_u, call.tree.max_depth)
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
