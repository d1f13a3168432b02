"""In-process A/B: draft_tree and eagle2_rerank as at BASE (a commit) against the working tree's,
for the 1/1/2 and 2/1/3 trees the CPU picks, each drafting timed right after a verify pass as a
cycle runs it, alternating, 300 rounds; medians; the drafted trees must be equal.

    .venv/bin/python bench/results/2026-11-27f_cpu-2core/ab_draft.py BASE
"""
import statistics, subprocess, sys, time, types
import torch
from eagle_kernels import ops
from eagle_kernels.ops import tree as tree_ops
from eagle_kernels.ops._validate import no_value_checks
from eagle_kernels.runtime import drafting
from eagle_kernels.runtime.api import from_pretrained
from eagle_kernels.runtime.tree_budget import cycle_calls
from eagle_kernels.runtime.drafting import TreeConfig

def old_function(path, name, module):
    src = subprocess.run(["git", "show", f"{sys.argv[1]}:{path}"], capture_output=True, text=True,
                         check=True).stdout
    start = src.index(f"def {name}(")
    end = src.find("\ndef ", start + 1); end = len(src) if end < 0 else end
    namespace = dict(module.__dict__)
    exec(src[start:end], namespace)
    return namespace[name]

old_rerank = old_function("eagle_kernels/ops/tree.py", "eagle2_rerank", tree_ops)
old_ops = types.SimpleNamespace(**{k: getattr(ops, k) for k in dir(ops) if not k.startswith("__")})
old_ops.eagle2_rerank = old_rerank
old_draft = old_function("eagle_kernels/runtime/drafting.py", "draft_tree", drafting)
old_draft.__globals__["ops"] = old_ops
gen = from_pretrained(tree="auto")
eng = gen.engine
for shape in ((1, 1, 2), (2, 1, 3)):
    tree = TreeConfig(*shape)
    with torch.inference_mode():
        _, verify = cycle_calls(eng.target, eng.head, tree, 256, 1)
        cache = eng.head.allocate_cache(1, 256 + tree.drafted_keys + 1); cache.lens.fill_(256)
    root = torch.zeros(1, dtype=torch.int64); hidden = torch.zeros(1, 576)
    res = {"old": [], "new": []}
    with torch.inference_mode(), no_value_checks(), ops.weights_unchanged():
        for r in range(300):
            for name, f in (("old", old_draft), ("new", drafting.draft_tree)):
                verify(); t = time.perf_counter(); d = f(eng.head, cache, root, hidden, tree)
                res[name].append(time.perf_counter() - t)
        a = old_draft(eng.head, cache, root, hidden, tree); b = drafting.draft_tree(eng.head, cache, root, hidden, tree)
        same = all(torch.equal(x, y) for x, y in zip(a, b))
    print(f"{tree.top_k}/{tree.depth}/{tree.total_tokens}: old {statistics.median(res['old'])*1e3:.3f} ms, new {statistics.median(res['new'])*1e3:.3f} ms, new/old {statistics.median(res['new'])/statistics.median(res['old']):.3f}, same tree {same}")
