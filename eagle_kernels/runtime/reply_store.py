"""Drafts from a store of the target's own earlier replies (retrieval drafting, as REST), for the
plain steps of speculative calls where the context itself has no draft.

A small model answers alike across prompts: the same openings, phrases, word endings and code
idioms. The store holds the target's greedy replies to prompts of its training split (never the
held-out ones), and for every n-gram of them (n in [STORE_MIN_NGRAM, STORE_MAX_NGRAM]) the token
that most often followed it and how often it did. A plain step without a context draft looks up
the last n tokens (longest n first) and drafts that one token when it followed at least
STORE_MIN_COUNT times and STORE_MIN_SHARE of the time. The target verifies it as any draft
(:mod:`.lookup`: greedy acceptance, or rejection sampling of a deterministic draft), so the
output is unchanged; only how many target passes it takes changes.

Thresholds chosen by replaying the target's greedy replies to 32 + 32 held-out ShareGPT /
HumanEval prompts x 128 tokens against the bundled store, a step verifying k drafted tokens
costing 1 + PER k plain steps (bench/results/2026-11-29_cpu-2core/replay_drafts.*): modelled
speedups over plain decoding with context drafts alone 1.12 / 1.31 at PER 0.35 and 1.07 / 1.21
at 0.45; with the store at share 0.8, count 2: 1.15 / 1.36 and 1.08 / 1.24; at share 0.5, count
1: the same at 0.35, 1.07 / 1.23 at 0.45. The loop paid 0.34 there (``loop_step_cost.txt``:
each extra row is fp32 multiply-adds over every weight on 2 cores), more when the VM is slow in
compute, and the share-0.5 store's drafts were accepted only 30 % of the time on ShareGPT in the
loop (``reply_store-share0.5.json``).

File format (safetensors): ``tokens`` int32 [T], the replies one after another, and
``offsets`` int64 [S + 1], where reply s is ``tokens[offsets[s]:offsets[s + 1]]``; metadata
``vocab_size`` (checked against the target's) and ``source`` (how the replies were made).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Sequence

import torch

from ..ops._validate import check_int
from .calls import _token_list

STORE_MIN_NGRAM = 2  # shortest match looked up (1-token matches mislead, as in .lookup)
STORE_MAX_NGRAM = 4  # longest match looked up
# A token is drafted when it followed its n-gram at least STORE_MIN_COUNT times and at least
# STORE_MIN_SHARE of the time: on this project's 2-core CPU a plain step that verifies one
# drafted token costs ~1.35-1.45 plain steps as the loop runs it, so a draft pays only where it
# is accepted more than ~35-45 % of the time.
STORE_MIN_SHARE = 0.8
STORE_MIN_COUNT = 2


class ReplyStore:
    """The most frequent follower of every n-gram of a set of replies (token-id lists).

    ``draft(history)`` is the token to draft after ``history`` ([] for none); ``replies`` keeps
    the token lists the table was built from (what :meth:`save` writes).
    """

    def __init__(self, replies: Sequence[Sequence[int]], vocab_size: int, source: str = "",
                 name: str = "replies"):
        self.vocab_size = check_int("vocab_size", vocab_size, 1)
        self.replies = [_token_list(f"{name}[{i}]", reply) for i, reply in enumerate(replies)]
        self.source = source
        bad = [t for reply in self.replies for t in reply if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{name}: token ids must lie in [0, {vocab_size}), got {bad[0]}")
        self.followers = _most_frequent_followers(self.replies)

    def __len__(self) -> int:
        """Tokens in the store."""
        return sum(map(len, self.replies))

    def draft(self, history: Sequence[int]) -> list[int]:
        """[token] that most often followed the longest n-gram ending ``history`` the store
        holds, if it did at least STORE_MIN_COUNT times and STORE_MIN_SHARE of the time; else
        []."""
        for n in range(min(STORE_MAX_NGRAM, len(history)), STORE_MIN_NGRAM - 1, -1):
            entry = self.followers.get(tuple(history[-n:]))
            if entry is not None:
                token, count, share = entry
                return [token] if count >= STORE_MIN_COUNT and share >= STORE_MIN_SHARE else []
        return []

    def save(self, path: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        lengths = torch.tensor([0] + [len(r) for r in self.replies], dtype=torch.int64)
        tokens = torch.tensor([t for reply in self.replies for t in reply], dtype=torch.int32)
        save_file({"tokens": tokens, "offsets": lengths.cumsum(0)}, str(path),
                  metadata={"vocab_size": str(self.vocab_size), "source": self.source})

    @classmethod
    def load(cls, path: str | os.PathLike, vocab_size: int) -> "ReplyStore":
        """A store saved by :meth:`save`, for a target of ``vocab_size`` tokens (a store made
        by another tokenizer is refused by name)."""
        from safetensors import safe_open

        path = Path(path)
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            names = set(handle.keys())
            if names != {"tokens", "offsets"}:
                raise ValueError(f"reply store {path}: expected tensors offsets and tokens, got "
                                 f"{', '.join(sorted(names)) or 'none'}")
            tokens, offsets = handle.get_tensor("tokens"), handle.get_tensor("offsets")
        stored = metadata.get("vocab_size")
        if stored != str(vocab_size):
            raise ValueError(f"reply store {path}: made for a vocabulary of {stored} tokens, the "
                             f"target has {vocab_size}")
        if tokens.dtype not in (torch.int32, torch.int64) or offsets.dtype != torch.int64:
            raise ValueError(f"reply store {path}: expected int32 / int64 tokens and int64 "
                             f"offsets, got {tokens.dtype} and {offsets.dtype}")
        if tokens.dim() != 1 or offsets.dim() != 1 or offsets.numel() < 1 or \
                int(offsets[0]) != 0 or int(offsets[-1]) != tokens.numel() or \
                bool((offsets[1:] < offsets[:-1]).any()):
            raise ValueError(f"reply store {path}: offsets must rise from 0 to the "
                             f"{tokens.numel()} tokens")
        flat, bounds = tokens.tolist(), offsets.tolist()
        replies = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return cls(replies, vocab_size, metadata.get("source", ""), f"reply store {path}")


def _most_frequent_followers(replies: list[list[int]]
                             ) -> dict[tuple[int, ...], tuple[int, int, float]]:
    """n-gram -> (its most frequent follower, how often it followed, the share of the n-gram's
    occurrences that is); ties go to the smaller token id (a fixed rule: the same store drafts
    alike on every machine)."""
    pairs: Counter = Counter()
    for reply in replies:
        for n in range(STORE_MIN_NGRAM, STORE_MAX_NGRAM + 1):
            grams = zip(*(reply[j:len(reply) - n + j] for j in range(n)))
            pairs.update(zip(grams, reply[n:]))
    totals: Counter = Counter()
    best: dict[tuple[int, ...], tuple[int, int]] = {}
    for (gram, token), count in pairs.items():
        totals[gram] += count
        held = best.get(gram)
        if held is None or count > held[1] or (count == held[1] and token < held[0]):
            best[gram] = (token, count)
    return {gram: (token, count, count / totals[gram]) for gram, (token, count) in best.items()}
