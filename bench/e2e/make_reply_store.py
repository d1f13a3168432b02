"""Make a reply store (eagle_kernels/runtime/reply_store.py): the target's own greedy replies to
training-split ShareGPT first turns and to code prompts from the standard library (never the
held-out ShareGPT prompts nor HumanEval), cut after EOS.

    python bench/e2e/make_reply_store.py --sharegpt 600 --code 600 \\
        --out eagle_kernels/stores/smollm2-135m-instruct-replies.safetensors

``--check FILE`` instead regenerates the first prompts of each set and checks that their
replies equal the ones FILE holds (a cheap proof that FILE came from this command).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def replies(generator, prompts: list[str], max_new: int, batch: int) -> list[list[int]]:
    """The target's greedy reply to each prompt (chat template), EOS included when reached."""
    from tqdm import tqdm

    out = []
    eos = generator.eos_token_ids()
    for start in tqdm(range(0, len(prompts), batch), desc="replies", leave=False):
        ids = [generator.encode(p, chat=True) for p in prompts[start:start + batch]]
        result = generator.engine.generate(ids, max_new, speculative=False, eos_token_ids=eos)
        out.extend(result.tokens)
    return out


def main(argv=None) -> int:
    from eagle_kernels.data import code_prompts, sharegpt_prompts
    from eagle_kernels.runtime.api import EagleGenerator
    from eagle_kernels.runtime.reply_store import ReplyStore

    parse = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parse.add_argument("--sharegpt", type=int, default=600, help="training-split first turns")
    parse.add_argument("--code", type=int, default=600, help="standard-library code prompts")
    parse.add_argument("--max-new-tokens", type=int, default=128)
    parse.add_argument("--batch", type=int, default=32)
    parse.add_argument("--out", help="the store to write")
    parse.add_argument("--check", help="a store to check instead (first --sharegpt / --code "
                                       "prompts of each set)")
    args = parse.parse_args(argv)
    if not (args.out or args.check):
        parse.error("expected --out or --check")
    started = time.perf_counter()
    generator = EagleGenerator.from_pretrained(draft="none", tree=None)
    vocab = generator.engine.target.vocab_size
    sets = {"sharegpt": sharegpt_prompts(args.sharegpt, split="train"),
            "code": code_prompts(args.code)}
    made = {name: replies(generator, prompts, args.max_new_tokens, args.batch)
            for name, prompts in sets.items()}
    if args.check:
        store = ReplyStore.load(args.check, vocab)
        # the stored sets in order: ShareGPT replies, then code replies (see `source` below)
        first_code = int(re.search(r"sharegpt=(\d+)", store.source).group(1))
        stored = {"sharegpt": store.replies[:args.sharegpt],
                  "code": store.replies[first_code:first_code + args.code]}
        for name in sets:
            same = sum(a == b for a, b in zip(made[name], stored[name]))
            print(f"{name}: {same} / {len(made[name])} replies equal the store's")
        return 0 if all(made[n] == stored[n] for n in sets) else 1
    source = (f"greedy replies of the default target, sharegpt={args.sharegpt} (train split, "
              f"first turns) code={args.code} (eagle_kernels.data.code_prompts) "
              f"max_new_tokens={args.max_new_tokens}")
    store = ReplyStore(made["sharegpt"] + made["code"], vocab, source)
    store.save(args.out)
    print(f"{args.out}: {len(store.replies)} replies, {len(store)} tokens, "
          f"{len(store.followers)} n-grams, {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
