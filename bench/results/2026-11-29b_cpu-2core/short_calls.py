"""Does speculative decoding still pay on short replies? ours-EAGLE against ours-AR by budget.

A 16-token smoke run of bench_llama_cpp.py (one prompt) had ours-EAGLE at 0.92-0.94x ours-AR:
is a short call slower, where the tree budget's probe every PROBE_EVERY calls (the head's
prompt commit and a few tree cycles) is not amortized? Per budget of 16 / 32 / 64 / 128 new
tokens: 16 held-out ShareGPT + 16 HumanEval prompts, one call per mode and prompt, the order
alternating, greedy with EOS; tokens / s over the summed prefill + decode times, and how many
of the speculative calls ran tree cycles (the probes).

    .venv/bin/python bench/results/2026-11-29b_cpu-2core/short_calls.py > short_calls.txt
"""

from eagle_kernels.data import humaneval_prompts, sharegpt_prompts
from eagle_kernels.runtime.api import from_pretrained

BUDGETS = (16, 32, 64, 128)


def main():
    generator = from_pretrained()
    engine, eos = generator.engine, generator.eos_token_ids()
    prompts = [generator.encode(p) for p in sharegpt_prompts(16, split="heldout")
               + humaneval_prompts(16)]
    for speculative in (True, False):  # untimed: first calls pay one-off costs
        engine.generate([prompts[0]], 8, speculative=speculative)
    for budget in BUDGETS:
        totals = {True: [0, 0.0], False: [0, 0.0]}
        with_trees = 0
        for index, ids in enumerate(prompts):
            for speculative in ((True, False) if index % 2 else (False, True)):
                out = engine.generate([ids], budget, eos_token_ids=eos, speculative=speculative)
                totals[speculative][0] += len(out.tokens[0])
                totals[speculative][1] += out.stats.prefill_seconds + out.stats.decode_seconds
                with_trees += speculative and bool(out.stats.tree_cycles)
        plain, eagle = (totals[mode][0] / totals[mode][1] for mode in (False, True))
        print(f"max_new_tokens {budget}: ours-AR {plain:.1f} tokens/s, ours-EAGLE {eagle:.1f} = "
              f"{eagle / plain:.3f}x; speculative calls that ran tree cycles {with_trees}/"
              f"{len(prompts)}", flush=True)


if __name__ == "__main__":
    main()
