"""In-process A/B of the weights_unchanged block memo (ops._validate.block_memo): the engine's
generate() over one chat prompt, 192 new tokens, with the memo on / off alternating for 8 rounds
(one process, so the VM's drifting speed hits both sides alike); medians of per-token times and
of the per-round ratio; the tokens must be the same.

    .venv/bin/python bench/results/2026-11-27e_cpu-2core/ab_memo.py [plain|spec]
"""
import statistics
import sys
import time

import eagle_kernels.ops.decoder as decoder
import eagle_kernels.ops.layer as layer
from eagle_kernels.runtime.api import from_pretrained

ROUNDS, NEW_TOKENS = 8, 192
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def set_memo(on: bool, real=decoder.block_memo) -> None:
    decoder.block_memo = layer.block_memo = real if on else (lambda: None)


def main() -> None:
    speculative = len(sys.argv) > 1 and sys.argv[1] == "spec"
    generator = from_pretrained(tree="auto")
    engine, prompt = generator.engine, generator.encode(PROMPT)
    for _ in range(2):
        engine.generate([prompt], 64, speculative=speculative)
    per_token, tokens = {True: [], False: []}, {}
    for _ in range(ROUNDS):
        for on in (False, True):
            set_memo(on)
            start = time.perf_counter()
            out = engine.generate([prompt], NEW_TOKENS, speculative=speculative)
            per_token[on].append((time.perf_counter() - start) / len(out.tokens[0]) * 1e3)
            assert tokens.setdefault(on, out.tokens[0]) == out.tokens[0]
    ratio = statistics.median(a / b for a, b in zip(per_token[True], per_token[False]))
    print(f"{'speculative' if speculative else 'plain'}: memo off "
          f"{statistics.median(per_token[False]):.3f} ms/token, on "
          f"{statistics.median(per_token[True]):.3f} ms/token, on / off {ratio:.3f}x, same tokens "
          f"{tokens[True] == tokens[False]}")


if __name__ == "__main__":
    main()
