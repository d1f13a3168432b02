"""How much of the target's own replies a draft vocabulary of each size covers (issue 17: the
bundled head drafts from 8192 of the 49152 tokens, and a token outside them is a miss).

    .venv/bin/python bench/results/2026-11-27h_cpu-2core/vocab_coverage.py > vocab_coverage.txt

The target answers 24 held-out ShareGPT and 24 HumanEval prompts greedily (128 tokens, plain
decoding). Coverage = the share of those reply tokens inside the vocabulary: the bundled head's
(its t2d), and the most frequent V tokens of the assistant turns of ShareGPT train-split
conversations (original text, as data.draft_vocabulary picks them from training data).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from eagle_kernels.data import (draft_vocabulary, humaneval_prompts, iter_sharegpt,  # noqa: E402
                                sharegpt_messages, sharegpt_prompts)
from eagle_kernels.runtime.api import from_pretrained  # noqa: E402

HEAD = ROOT / "eagle_kernels" / "heads" / "smollm2-135m-instruct-eagle3" / "model.safetensors"
SIZES = (8192, 12288, 16384, 24576, 32768)
CONVERSATIONS = 3000


def replies(generator, prompts: list[str]) -> list[int]:
    tokens = []
    for start in range(0, len(prompts), 8):
        out = generator.generate(prompts[start:start + 8], max_new_tokens=128, speculative=False)
        tokens += [t for reply in out.tokens for t in reply]
    return tokens


def train_counts(tokenizer, vocab: int) -> torch.Tensor:
    counts = torch.zeros(vocab, dtype=torch.float64)
    seen = 0
    for record in iter_sharegpt(split="train"):
        messages = sharegpt_messages(record)
        if messages is None:
            continue
        text = "\n".join(m["content"] for m in messages if m["role"] == "assistant")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        counts += torch.bincount(torch.tensor(ids, dtype=torch.int64), minlength=vocab).double()
        seen += 1
        if seen == CONVERSATIONS:
            break
    return counts


def main() -> None:
    generator = from_pretrained(draft="none")
    vocab = generator.engine.target.vocab_size
    sets = {"sharegpt-heldout": replies(generator, sharegpt_prompts(24, split="heldout")),
            "humaneval": replies(generator, humaneval_prompts(24))}
    bundled = load_file(str(HEAD))["t2d"].bool()
    counts = train_counts(generator.tokenizer, vocab)
    eos = generator.eos_token_ids()
    print(f"reply tokens: " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()))
    for name, tokens in sets.items():
        ids = torch.tensor(tokens)
        row = [f"bundled 8192: {bundled[ids].double().mean():.3f}"]
        for size in SIZES:
            _, t2d = draft_vocabulary(counts, size, always=eos)
            row.append(f"{size}: {t2d[ids].double().mean():.3f}")
        print(f"{name}: coverage " + ", ".join(row))


if __name__ == "__main__":
    main()
