"""Replay plain steps with context drafts, with and without the bundled reply store, over the
target's greedy replies (EOS cut, 128 tokens at most) to the first N held-out ShareGPT /
HumanEval prompts: the modelled speedup over plain decoding (tokens / cost in plain steps, a
step verifying a k-token draft costing 1 + PER k plain steps) for several per-node costs PER and
store thresholds (share, count). No pause rule (the loop's drafts-lose check) is modelled.

    python bench/results/2026-11-29_cpu-2core/replay_drafts.py 32 > replay_drafts.txt
"""
import sys

import torch

from eagle_kernels.data import humaneval_prompts, sharegpt_prompts
from eagle_kernels.runtime.api import DEFAULT_REPLY_STORE, EagleGenerator
from eagle_kernels.runtime.lookup import LOOKUP_MAX_NGRAM, ContextIndex
from eagle_kernels.runtime.reply_store import STORE_MAX_NGRAM, STORE_MIN_NGRAM, ReplyStore


def store_draft(store, history, share, count):
    """ReplyStore.draft with the thresholds as arguments."""
    for n in range(min(STORE_MAX_NGRAM, len(history)), STORE_MIN_NGRAM - 1, -1):
        entry = store.followers.get(tuple(history[-n:]))
        if entry is not None:
            return [entry[0]] if entry[1] >= count and entry[2] >= share else []
    return []


def replay(sequences, per, store=None, share=0.8, count=2):
    tokens = cost = 0.0
    for prompt, reply in sequences:
        index = ContextIndex([prompt + reply[:1]])  # reply[0] comes from the prefill
        pos = 1
        while pos < len(reply):
            left = len(reply) - pos
            draft = index.propose(0, max(min(LOOKUP_MAX_NGRAM, left - 1), 0))
            if not draft and store is not None and left >= 2:
                draft = store_draft(store, index.tokens[0], share, count)
            accepted = 0
            while accepted < len(draft) and reply[pos + accepted] == draft[accepted]:
                accepted += 1
            made = min(accepted + 1, left)
            cost += 1 + per * len(draft)
            index.extend(0, reply[pos:pos + made])
            pos += made
            tokens += made
    return tokens / cost


def main() -> int:
    count = int(sys.argv[1])
    generator = EagleGenerator.from_pretrained(draft="none", tree=None)
    eos = generator.eos_token_ids()
    store = ReplyStore.load(DEFAULT_REPLY_STORE, generator.engine.target.vocab_size)
    sets = {"sharegpt": sharegpt_prompts(count, split="heldout"),
            "humaneval": humaneval_prompts(count)}
    print(f"store: {len(store.replies)} replies, {len(store)} tokens")
    for name, prompts in sets.items():
        ids = [generator.encode(p) for p in prompts]
        out = generator.engine.generate(ids, 128, speculative=False, eos_token_ids=eos)
        sequences = list(zip(ids, out.tokens))
        for per in (0.24, 0.35, 0.45):
            cells = [f"context {replay(sequences, per):.3f}"]
            for share, least in ((0.5, 1), (0.8, 2), (0.9, 3)):
                cells.append(f"+store {share}/{least} "
                             f"{replay(sequences, per, store, share, least):.3f}")
            print(f"{name:9s} PER {per}: " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
