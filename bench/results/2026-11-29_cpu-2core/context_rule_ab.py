"""A/B of the context-draft rule in plain steps: the shortest match that proposes a draft
(LOOKUP_MIN_NGRAM 2, as shipped, vs 3), with the reply store on in both, beside ours-AR;
held-out prompts, one call per method per prompt and round, order rotating."""
import json, sys
from pathlib import Path
from eagle_kernels.data import humaneval_prompts, sharegpt_prompts
from eagle_kernels.runtime import lookup
from eagle_kernels.runtime.api import from_pretrained

N, ROUNDS, OUT = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
g = from_pretrained()
eos = g.eos_token_ids()
VARIANTS = {"ours-ar": None, "min2": 2, "min3": 3}
shipped = lookup.LOOKUP_MIN_NGRAM
def call(ids, name):
    n = VARIANTS[name]
    lookup.LOOKUP_MIN_NGRAM = n or shipped
    try:
        out = g.engine.generate([ids], 128, eos_token_ids=eos, speculative=n is not None)
    finally:
        lookup.LOOKUP_MIN_NGRAM = shipped
    s = out.stats
    return out.tokens[0], s.prefill_seconds + s.decode_seconds, 1 + s.cycles
report = {}
for set_name, prompts in {"sharegpt": sharegpt_prompts(N, split="heldout"),
                          "humaneval": humaneval_prompts(N)}.items():
    tot = {v: [0, 0.0, 0, 0] for v in VARIANTS}
    turn = 0
    for _ in range(ROUNDS):
        for p in prompts:
            ids = g.encode(p)
            names = list(VARIANTS)
            names = names[turn % 3:] + names[:turn % 3]; turn += 1
            outs = {}
            for name in names:
                toks, sec, passes = call(ids, name)
                outs[name] = toks
                t = tot[name]; t[0] += len(toks); t[1] += sec; t[2] += passes
            for name in VARIANTS:
                tot[name][3] += outs[name] == outs["ours-ar"]
    ar = tot["ours-ar"][0] / tot["ours-ar"][1]
    report[set_name] = {v: {"tokens_per_s": round(t[0] / t[1], 2), "x_ours_ar": round(t[0] / t[1] / ar, 3),
                            "tokens_per_pass": round(t[0] / t[2], 3), "same_as_ar": f"{t[3]}/{N * ROUNDS}"}
                        for v, t in tot.items()}
    print(set_name, report[set_name], flush=True)
OUT.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "report": report}, indent=1))
