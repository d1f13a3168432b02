"""The ops as a drop-in: tree attention + acceptance inside *your own* decoding code.

    python python/ops_dropin.py --smoke             # tiny sizes, a second or two
    python python/ops_dropin.py --compile           # verify step under torch.compile(fullgraph)

Nothing here uses the eagle_kernels runtime. ``ToyLM`` stands for a model you already have: its
own weights, its own KV cache (NHD: ``[B, max_len, kv_heads, head_dim]`` + ``cache_lens``), its
own drafter (here: the model's attention-free "bigram" path, top-2 children per node). What
the example takes from eagle_kernels is only the four ops of one speculative step:

    depth, tree_mask, paths = ops.build_tree(parents)            # your tree -> mask, paths
    out = ops.tree_attention(q, k_cache, v_cache, cache_lens, tree_mask)   # in your attention
    result = ops.greedy_accept_tree(tokens, paths, logits)       # longest agreeing path + bonus
    ops.compact_kv([k_cache, v_cache], cache_lens, result.accepted_nodes, result.num_accepted)

The verify step is written against the registered custom ops (``torch.ops.eagle_kernels.*``,
same functions, tuples for results), so ``--compile`` runs it under
``torch.compile(fullgraph=True)`` with no graph break. At the end the speculative output is
checked against plain greedy decoding of the same model: identical, token for token.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import eagle_kernels.ops as ops

lib = torch.ops.eagle_kernels  # the same ops, registered with torch.library


class ToyLM(nn.Module):
    """Somebody's decoder: embeddings + one GQA attention layer + MLP, static KV cache."""

    def __init__(self, vocab: int, hidden: int, heads: int, kv_heads: int, max_len: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        self.wq = nn.Linear(hidden, hidden, bias=False)
        self.wkv = nn.Linear(hidden, 2 * kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(),
                                 nn.Linear(2 * hidden, hidden))
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():
            self.wo.weight.mul_(6.0)      # enough attention that drafts are sometimes wrong
            self.lm_head.weight.mul_(4.0)  # decisive logits

    def bigram_logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The cheap drafter: the model without its attention layer."""
        x = self.embed(tokens) + self.pos(positions)
        return self.lm_head(x + self.mlp(x))

    def forward(self, tokens, positions, k_cache, v_cache, cache_lens, tree_mask,
                attention=ops.tree_attention):
        """Logits [B, T, V] of T new tokens; their K/V go to ``cache_lens + [0, T)``."""
        batch, count = tokens.shape
        x = self.embed(tokens) + self.pos(positions)
        q = self.wq(x).view(batch, count, self.heads, self.head_dim)
        k, v = self.wkv(x).view(batch, count, 2, self.kv_heads, self.head_dim).unbind(2)
        rows = torch.arange(batch).unsqueeze(1)
        slots = cache_lens.long().unsqueeze(1) + torch.arange(count)
        k_cache[rows, slots] = k
        v_cache[rows, slots] = v
        attended = attention(q.contiguous(), k_cache, v_cache, cache_lens, tree_mask)
        x = x + self.wo(attended.reshape(batch, count, -1))
        return self.lm_head(x + self.mlp(x))


# A fixed tree shape: root -> 2 children -> 2 children each (7 nodes, depth 2).
PARENTS = [-1, 0, 0, 1, 1, 2, 2]


def draft_tree(model: ToyLM, root: torch.Tensor, cache_lens: torch.Tensor) -> torch.Tensor:
    """Your drafter fills the tree: [B, 7] int64 tokens, node 0 the root."""
    position = cache_lens.long()
    first = model.bigram_logits(root, position).topk(2, dim=-1).indices            # [B, 2]
    second = model.bigram_logits(first, position.unsqueeze(1) + 1).topk(2, -1).indices
    return torch.cat([root.unsqueeze(1), first, second.flatten(1)], dim=1)


def verify_step(model, tokens, parents, k_cache, v_cache, cache_lens):
    """One target pass over the tree + greedy acceptance + KV compaction (registered ops)."""
    depth, tree_mask, paths = lib.build_tree(parents)
    positions = cache_lens.long().unsqueeze(1) + depth
    logits = model(tokens, positions, k_cache, v_cache, cache_lens, tree_mask,
                   attention=lib.tree_attention)
    output_tokens, num_accepted, accepted_nodes = lib.greedy_accept_tree(tokens, paths, logits)
    lib.compact_kv([k_cache, v_cache], cache_lens, accepted_nodes, num_accepted)
    return output_tokens, num_accepted


def prefill(model, prompts, max_len):
    """Fresh cache with the prompts in it; returns (k, v, cache_lens, first new token)."""
    batch, length = prompts.shape
    k_cache = torch.zeros(batch, max_len, model.kv_heads, model.head_dim)
    v_cache = torch.zeros_like(k_cache)
    cache_lens = torch.zeros(batch, dtype=torch.int32)
    chain = torch.arange(-1, length - 1, dtype=torch.int32).expand(batch, -1).contiguous()
    _, causal_mask, _ = ops.build_tree(chain)  # a chain-shaped tree is a causal mask
    logits = model(prompts, torch.arange(length).expand(batch, -1), k_cache, v_cache,
                   cache_lens, causal_mask)
    return k_cache, v_cache, cache_lens + length, logits[:, -1].argmax(-1)


@torch.no_grad()
def greedy(model, prompts, new_tokens, max_len):
    """Plain autoregressive greedy decoding: the reference output."""
    k_cache, v_cache, cache_lens, token = prefill(model, prompts, max_len)
    out = [token]
    one = torch.ones(prompts.shape[0], 1, 1, dtype=torch.int32)  # a lone node sees itself
    for _ in range(new_tokens - 1):
        logits = model(token.unsqueeze(1), cache_lens.long().unsqueeze(1), k_cache, v_cache,
                       cache_lens, one)
        cache_lens += 1
        token = logits[:, 0].argmax(-1)
        out.append(token)
    return torch.stack(out, 1).tolist()


@torch.no_grad()
def speculative(model, prompts, new_tokens, max_len, step):
    k_cache, v_cache, cache_lens, root = prefill(model, prompts, max_len)
    batch = prompts.shape[0]
    parents = torch.tensor(PARENTS, dtype=torch.int32).expand(batch, -1).contiguous()
    out = [[int(t)] for t in root]
    cycles = 0
    while min(len(o) for o in out) < new_tokens:
        tokens = draft_tree(model, root, cache_lens)
        output_tokens, num_accepted = step(model, tokens, parents, k_cache, v_cache, cache_lens)
        cache_lens += num_accepted + 1                 # root + accepted nodes are now committed
        root = output_tokens.gather(1, num_accepted.long().unsqueeze(1)).squeeze(1)  # bonus
        for b in range(batch):
            out[b] += output_tokens[b, :int(num_accepted[b]) + 1].tolist()
        cycles += 1
    return [o[:new_tokens] for o in out], cycles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile(fullgraph=True) the verify step")
    args = parser.parse_args()
    vocab, hidden, heads, kv_heads, batch, length, new_tokens = (
        (64, 32, 4, 2, 2, 6, 24) if args.smoke else (2000, 256, 8, 2, 4, 32, 96))
    max_len = length + 3 * new_tokens + len(PARENTS)  # a cycle commits at most 3 tokens

    torch.manual_seed(0)
    model = ToyLM(vocab, hidden, heads, kv_heads, max_len).eval()
    prompts = torch.randint(0, vocab, (batch, length))
    step = verify_step
    if args.compile:
        step = torch.compile(verify_step, fullgraph=True, backend="aot_eager")

    start = time.perf_counter()
    want = greedy(model, prompts, new_tokens, max_len)
    plain_seconds = time.perf_counter() - start
    start = time.perf_counter()
    got, cycles = speculative(model, prompts, new_tokens, max_len, step)
    spec_seconds = time.perf_counter() - start
    print(f"greedy decoding:      {new_tokens} target passes, {plain_seconds:.2f}s")
    print(f"speculative decoding: {cycles} target passes over a 7-node tree, "
          f"{spec_seconds:.2f}s{' (incl. compile)' if args.compile else ''}; "
          f"{new_tokens / cycles:.2f} tokens per pass")
    print("first sequence:", got[0][:16], "...")
    assert got == want, "speculative output must equal greedy decoding"
    print("identical to greedy decoding: yes\nok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
