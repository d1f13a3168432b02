# A/B of context drafts in sampling calls: per prompt ours-AR, ours-EAGLE (drafts on), ours-EAGLE
# with prompt_lookup=False, in turn, each sampling at TEMPERATURE with its own seed per prompt.
# Outputs differ between the three (the same seed draws differently once drafts are verified):
# tokens/s are compared, not tokens. Run: .venv/bin/python bench/results/2026-11-27_cpu-2core/lookup_sampling_ab.py [TEMPERATURE]
import sys
import eagle_kernels
from eagle_kernels.data import humaneval_prompts, sharegpt_prompts
from eagle_kernels.runtime import SamplingConfig
temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
gen = eagle_kernels.from_pretrained(tree="auto")
eos = gen.eos_token_ids()
eng = gen.engine
print(f"temperature {temperature}, 8 + 8 held-out prompts x 128 new tokens, batch 1")
for name, prompts in (("humaneval", humaneval_prompts(8)), ("sharegpt", sharegpt_prompts(8, split="heldout"))):
    t = {"ar": [0, 0.0], "spec": [0, 0.0], "nolook": [0, 0.0]}; ls = la = 0
    for seed, p in enumerate(prompts):
        ids = gen.encode(p)
        sampling = SamplingConfig(temperature=temperature, seed=seed)
        a = eng.generate([ids], 128, sampling=sampling, eos_token_ids=eos, speculative=False)
        b = eng.generate([ids], 128, sampling=sampling, eos_token_ids=eos)
        eng.prompt_lookup = False
        c = eng.generate([ids], 128, sampling=sampling, eos_token_ids=eos)
        eng.prompt_lookup = True
        for k, o in (("ar", a), ("spec", b), ("nolook", c)):
            t[k][0] += len(o.tokens[0]); t[k][1] += o.stats.prefill_seconds + o.stats.decode_seconds
        ls += b.stats.lookup_steps; la += b.stats.lookup_accepted
    r = {k: v[0] / v[1] for k, v in t.items()}
    print(name, {k: round(v, 1) for k, v in r.items()}, "spec/ar %.3f nolook/ar %.3f" % (r["spec"] / r["ar"], r["nolook"] / r["ar"]),
          "tokens", {k: v[0] for k, v in t.items()}, "lookup steps", ls, "accepted", la)
