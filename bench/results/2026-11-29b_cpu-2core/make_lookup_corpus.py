"""The reply store's text, for llama.cpp's static n-gram cache (its analog of the store).

Writes the bundled reply store's 1200 replies (the target's own greedy replies to training-split
ShareGPT and code prompts: eagle_kernels/stores/) decoded to text, one after another, each
ended by a blank line, to the file given; `llama-lookup-create -f FILE -lcs CACHE` then hashes
its n-grams, and `llama-lookup -lcs CACHE` drafts from them as from the context.

    .venv/bin/python bench/results/2026-11-29b_cpu-2core/make_lookup_corpus.py /tmp/replies.txt
"""

import sys
from pathlib import Path

from eagle_kernels.runtime.api import DEFAULT_REPLY_STORE, from_pretrained


def main():
    generator = from_pretrained()
    store = generator.engine.reply_store
    if store is None:
        raise SystemExit(f"no reply store loaded ({DEFAULT_REPLY_STORE})")
    text = "".join(generator.tokenizer.decode(reply, skip_special_tokens=True) + "\n\n"
                   for reply in store.replies)
    Path(sys.argv[1]).write_text(text)
    print(f"{len(store.replies)} replies, {len(store)} tokens -> {len(text)} characters")


if __name__ == "__main__":
    main()
