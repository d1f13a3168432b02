# A/B of context drafts: per prompt ours-AR, ours-EAGLE (drafts on), ours-EAGLE with prompt_lookup=False, in turn.
# Run: .venv/bin/python bench/results/2026-11-26d_cpu-2core/lookup_ab.py
import sys, time, torch, eagle_kernels
from eagle_kernels.data import humaneval_prompts, sharegpt_prompts
gen = eagle_kernels.from_pretrained(tree="auto")
eos = gen.eos_token_ids()
eng = gen.engine
for name, prompts in (("humaneval", humaneval_prompts(8)), ("sharegpt", sharegpt_prompts(8, split="heldout"))):
    t = {"ar": [0, 0.0], "spec": [0, 0.0], "nolook": [0, 0.0]}; same = 0; ls = la = 0
    for p in prompts:
        ids = gen.encode(p)
        a = eng.generate([ids], 128, eos_token_ids=eos, speculative=False)
        b = eng.generate([ids], 128, eos_token_ids=eos)
        eng.prompt_lookup = False
        c = eng.generate([ids], 128, eos_token_ids=eos)
        eng.prompt_lookup = True
        for k, o in (("ar", a), ("spec", b), ("nolook", c)):
            t[k][0] += len(o.tokens[0]); t[k][1] += o.stats.prefill_seconds + o.stats.decode_seconds
        same += a.tokens == b.tokens == c.tokens
        ls += b.stats.lookup_steps; la += b.stats.lookup_accepted
        print(b.stats.summary()["fallback"][:60], b.stats.lookup_steps, b.stats.lookup_accepted, b.stats.cycles, file=sys.stderr)
    r = {k: v[0] / v[1] for k, v in t.items()}
    print(name, {k: round(v, 1) for k, v in r.items()}, "spec/ar %.3f nolook/ar %.3f" % (r["spec"]/r["ar"], r["nolook"]/r["ar"]), "same", same, "lookup steps", ls, "accepted", la)
