"""Make a reply store (eagle_kernels/runtime/reply_store.py): the target's own greedy replies to
training-split ShareGPT first turns and to code prompts from the standard library (never the
held-out ShareGPT prompts nor HumanEval), cut after EOS.

    python bench/e2e/make_reply_store.py --sharegpt 600 --code 600 \\
        --out eagle_kernels/stores/smollm2-135m-instruct-replies.safetensors

``--check FILE --sharegpt 32 --code 32`` instead remakes the first 32 replies of each set and
checks that they equal the ones FILE holds (a cheap proof that FILE came from this command;
refused where this Python's standard library gives other code prompts than FILE's).
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "e2e"))
from bench_agreement import greedy_replies  # noqa: E402  (the same batched greedy decoding)


def replies(generator, prompts: list[str], max_new: int, batch: int) -> list[list[int]]:
    """The target's greedy reply to each prompt, EOS included when reached."""
    return [reply for _, reply in greedy_replies(generator, prompts, max_new, batch,
                                                 generator.eos_token_ids())]


def stored_counts(source: str) -> dict[str, str]:
    """The key=value fields of a store's ``source`` (see :func:`main`)."""
    return dict(re.findall(r"(\w+)=(\S+)", source))


def check(generator, path: str, args) -> int:
    """Remake the first --sharegpt / --code replies of each set and compare them with the
    store's (0: all equal)."""
    from eagle_kernels.data import code_prompts, prompts_digest, sharegpt_prompts
    from eagle_kernels.runtime.reply_store import ReplyStore

    store = ReplyStore.load(path, generator.engine.target.vocab_size)  # a bad file fails first
    fields = stored_counts(store.source)
    first_code = int(fields["sharegpt"])
    if prompts_digest(code_prompts(int(fields["code"]))) != fields.get("code_digest"):
        print(f"the standard library here (Python {platform.python_version()}) gives other code "
              f"prompts than the store's (Python {fields.get('python')}): cannot compare")
        return 2
    stored = {"sharegpt": store.replies[:args.sharegpt],
              "code": store.replies[first_code:first_code + args.code]}
    sets = {"sharegpt": sharegpt_prompts(args.sharegpt, split="train"),
            "code": code_prompts(args.code)}
    same = True
    for name, prompts in sets.items():
        made = replies(generator, prompts, args.max_new_tokens, args.batch)
        equal = sum(a == b for a, b in zip(made, stored[name]))
        print(f"{name}: {equal} / {len(made)} replies equal the store's")
        same &= made == stored[name]
    return 0 if same else 1


def main(argv=None) -> int:
    from eagle_kernels.data import code_prompts, prompts_digest, sharegpt_prompts
    from eagle_kernels.runtime.api import EagleGenerator
    from eagle_kernels.runtime.reply_store import ReplyStore

    parse = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parse.add_argument("--sharegpt", type=int, default=600, help="training-split first turns")
    parse.add_argument("--code", type=int, default=600, help="standard-library code prompts")
    parse.add_argument("--max-new-tokens", type=int, default=128)
    parse.add_argument("--batch", type=int, default=32)
    parse.add_argument("--out", help="the store to write")
    parse.add_argument("--check", help="a store to check instead: remakes the first --sharegpt "
                                       "/ --code replies of each set (e.g. 32 each)")
    args = parse.parse_args(argv)
    if not (args.out or args.check):
        parse.error("expected --out or --check")
    started = time.perf_counter()
    generator = EagleGenerator.from_pretrained(draft="none", tree=None)
    if args.check:
        return check(generator, args.check, args)
    code = code_prompts(args.code)
    made = (replies(generator, sharegpt_prompts(args.sharegpt, split="train"),
                    args.max_new_tokens, args.batch)
            + replies(generator, code, args.max_new_tokens, args.batch))
    # the ShareGPT replies first, then the code replies (check() splits them by these counts)
    source = (f"greedy replies of the default target, sharegpt={args.sharegpt} (train split, "
              f"first turns) code={args.code} (eagle_kernels.data.code_prompts) "
              f"max_new_tokens={args.max_new_tokens} python={platform.python_version()} "
              f"code_digest={prompts_digest(code)}")
    store = ReplyStore(made, generator.engine.target.vocab_size, source)
    store.save(args.out)
    print(f"{args.out}: {len(store.replies)} replies, {len(store)} tokens, "
          f"{len(store.followers)} n-grams, {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
