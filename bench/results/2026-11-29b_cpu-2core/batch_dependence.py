"""Does llama.cpp's greedy output depend on how many prompt tokens it computes together?

llama-completion answers each prompt twice, greedy, 128 tokens: with its default micro-batch
(the whole prompt in one pass) and with ``-ub 1`` (the prompt one token at a time, as single-token
decode steps compute). A row-invariant code gives the same reply both ways; this prints, per
prompt set, how many replies are equal and their common prefix in characters, then the total.
Ours is row-invariant by construction (tests/test_row_invariance.py checks it bitwise).

    .venv/bin/python bench/results/2026-11-29b_cpu-2core/batch_dependence.py /tmp/llamacpp/build 12
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "e2e"))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))
import bench_llama_cpp as bench  # noqa: E402

from eagle_kernels.data import humaneval_prompts, sharegpt_prompts  # noqa: E402
from eagle_kernels.runtime.api import from_pretrained  # noqa: E402
from eagle_kernels.runtime.default_model import find_smollm2_gguf  # noqa: E402


def main():
    build, count = Path(sys.argv[1]), int(sys.argv[2])
    args = type("Args", (), {"max_new_tokens": 128, "threads": 2})
    binary = bench.find_binaries(build)["llama.cpp"]
    generator, gguf = from_pretrained(), find_smollm2_gguf()
    equal_total = 0
    for name, prompts in (("sharegpt", sharegpt_prompts(count, split="heldout")),
                          ("humaneval", humaneval_prompts(count))):
        equal, prefixes = 0, []
        for prompt in prompts:
            text = generator.tokenizer.decode(generator.encode(prompt))
            whole = bench.run_completion(binary, gguf, text, args)["text"]
            one_by_one = bench.run_completion(binary, gguf, text, args, ("-ub", "1"))["text"]
            equal += whole == one_by_one
            prefixes.append(bench.common_prefix(whole, one_by_one))
        equal_total += equal
        print(f"{name}: {equal}/{len(prompts)} replies equal with -ub 1 and without; common "
              f"prefix (characters) per prompt: {prefixes}")
    print(f"total: {equal_total}/{2 * count} equal")


if __name__ == "__main__":
    main()
