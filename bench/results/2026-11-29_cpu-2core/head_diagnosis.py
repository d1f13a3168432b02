"""Why does the bundled head's step-0 draft agree with the target only ~40 % of the time?
Teacher-forced on the target's greedy replies (128 tokens, no EOS cut) to the first N held-out
ShareGPT / HumanEval prompts, as bench_agreement.py: the share of next tokens inside the head's
draft vocabulary, the head's top-1 / top-k agreement, and both by the target's own confidence
(its top-1 probability at that position).

    python bench/results/2026-11-29_cpu-2core/head_diagnosis.py 32 > head_diagnosis.txt
"""
import sys, torch
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
for sub in ("bench/e2e", "bench/kernels", "bench"):
    sys.path.insert(0, str(ROOT / sub))
from bench_agreement import greedy_replies
from eagle_kernels.runtime.api import EagleGenerator
from eagle_kernels.runtime import training
from eagle_kernels.ops._validate import no_value_checks
from eagle_kernels.data import humaneval_prompts, sharegpt_prompts
g = EagleGenerator.from_pretrained(tree=None, draft_weights="exact")
target, head = g.engine.target, g.engine.head
N = int(sys.argv[1])
for name, prompts in [("sharegpt", sharegpt_prompts(N, split="heldout")), ("humaneval", humaneval_prompts(N))]:
    seqs = greedy_replies(g, prompts, 128, 16)
    pad = g.eos_token_ids()[0]
    allp, allhit, allcov, allrank, allent = [], [], [], [], []
    for s in range(0, len(seqs), 16):
        chunk = seqs[s:s+16]
        L = max(len(p)+len(r) for p, r in chunk)
        ids = torch.full((len(chunk), L), pad, dtype=torch.int64); reply = torch.zeros(len(chunk), L, dtype=torch.bool)
        for b, (p, r) in enumerate(chunk):
            ids[b, :len(p)+len(r)] = torch.tensor(p + r); reply[b, len(p):len(p)+len(r)] = True
        with torch.no_grad():
            hidden, feats = training.target_pass(target, ids, head.feature_layers)
            full = target.logits(hidden).float()  # [B,L,V]
            draft_ids = training.draft_vocab_ids(head)
            logits, argmax = training.target_draft_logits(target, hidden, draft_ids)
            with no_value_checks():
                res = training.eagle3_ttt_loss(head, feats.float(), ids, logits, head.t2d[argmax], reply, steps=1, keep_hidden=True)
            dl = head.draft_logits(res.hidden[0])  # [B,L,Vd]
            order = dl.argsort(-1, descending=True)[..., :10]
            pred10 = draft_ids[order]  # [B,L,10]
        truth = torch.full_like(ids, -1); truth[:, :L-2] = ids[:, 2:]
        valid = torch.zeros_like(reply); valid[:, :L-2] = reply[:, 1:L-1] & reply[:, 2:]
        # target prob of its top-1 at position p+1 (predicts token p+2)
        probs = full.softmax(-1)
        top1p = torch.zeros(ids.shape); top1p[:, :L-1] = probs[:, 1:].max(-1).values
        ent = torch.zeros(ids.shape); ent[:, :L-1] = -(probs[:, 1:] * probs[:, 1:].clamp_min(1e-30).log()).sum(-1)
        incov = torch.isin(truth, draft_ids)
        rank = torch.full(ids.shape, 99); m = (pred10 == truth.unsqueeze(-1))
        anyhit = m.any(-1); rank[anyhit] = m.float().argmax(-1)[anyhit]
        allp.append(top1p[valid]); allcov.append(incov[valid]); allrank.append(rank[valid]); allent.append(ent[valid])
    p = torch.cat(allp); cov = torch.cat(allcov).float(); rk = torch.cat(allrank); ent = torch.cat(allent)
    n = len(p)
    print(f"== {name}: {n} positions; in draft vocab {cov.mean():.3f}; top-1 {(rk==0).float().mean():.3f}; top-2 {(rk<2).float().mean():.3f} top-3 {(rk<3).float().mean():.3f} top-5 {(rk<5).float().mean():.3f} top-10 {(rk<10).float().mean():.3f}; mean target top-1 prob {p.mean():.3f}; mean entropy {ent.mean():.2f} nats")
    for lo, hi in [(0,.2),(.2,.4),(.4,.6),(.6,.8),(.8,.95),(.95,1.01)]:
        sel = (p >= lo) & (p < hi)
        if sel.any():
            c = sel & (cov > 0)
            print(f"  target top-1 prob [{lo:.2f},{hi:.2f}): share {sel.float().mean():.3f} in-vocab {cov[sel].mean():.3f} head top-1 acc {(rk[sel]==0).float().mean():.3f} (in-vocab {(rk[c]==0).float().mean():.3f}) top-3 {(rk[sel]<3).float().mean():.3f}")
