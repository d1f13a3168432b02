"""Lossless by construction: on the cpu backend a token's logits do not depend on how many
tokens are computed with it.

The logits of every node of a verify pass over N tree nodes (batch 2, prefixes of different
lengths, random tree shapes, N 1..64) must equal, bit for bit, the logits of the same token
decoded one token at a time from an empty cache over the same prefix and the node's ancestors.
Prefill rows are checked the same way. With this, greedy speculative output equals greedy
autoregressive output for every prompt, not only for the prompts a test happens to run.
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops._backend import resolve
from eagle_kernels.runtime.drafting import causal_tree_mask

from conftest import SHAPES, random_parents
from cpu_support import needs_cpu_backend
from cuda_support import seed_note
from runtime_helpers import tiny_target

pytestmark = needs_cpu_backend

PREFIXES = (23, 6)  # batch 2: sequences of different committed lengths


@pytest.fixture(scope="module")
def target():
    model = tiny_target(seed=3, layers=3)
    for op in ("linear", "rms_norm", "apply_rope", "silu_mul", "tree_attention"):
        chosen, _ = resolve(op, "auto", torch.device("cpu"), dtype=torch.float32)
        assert chosen == "cpu", (op, chosen)  # the row-invariant kernels are what auto runs
    return model


def _one(token: int, position: int):
    return (torch.tensor([[token]]), torch.tensor([[position]]))


class Decoder:
    """Token-by-token decoding of one sequence from an empty cache (the AR baseline's path)."""

    def __init__(self, target, prefix: list[int], room: int):
        self.target = target
        self.cache = target.allocate_cache(1, len(prefix) + room)
        self.mask = torch.ones(1, 1, 1, dtype=torch.int32)
        self.logits = []
        for token in prefix:
            self.logits.append(self.step(token))

    def step(self, token: int) -> torch.Tensor:
        ids, positions = _one(token, int(self.cache.lens[0]))
        hidden, _ = self.target(ids, positions, self.cache, self.mask)
        self.cache.lens += 1
        return self.target.logits(hidden[0, 0])

    def fork(self) -> "Decoder":
        other = object.__new__(Decoder)
        other.target, other.mask, other.logits = self.target, self.mask, []
        other.cache = type(self.cache)([k.clone() for k in self.cache.keys],
                                       [v.clone() for v in self.cache.values],
                                       self.cache.lens.clone())
        return other


@pytest.mark.parametrize("num_nodes", [1, 2, 7, 33, 64])
def test_verify_logits_equal_decode_logits_bit_for_bit(gen, target, num_nodes):
    vocab = target.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PREFIXES]
    shape = SHAPES[num_nodes % len(SHAPES)]
    parents = random_parents(len(prompts), num_nodes, gen, shape)
    depth, mask, _ = ops.build_tree(parents)
    tokens = torch.randint(0, vocab, (len(prompts), num_nodes), generator=gen)

    with torch.inference_mode():
        # the runtime's way: one padded prefill pass, then one verify pass over the tree
        width = max(PREFIXES)
        ids = torch.zeros(len(prompts), width, dtype=torch.int64)
        for b, prompt in enumerate(prompts):
            ids[b, :len(prompt)] = torch.tensor(prompt)
        cache = target.allocate_cache(len(prompts), width + num_nodes)
        positions = torch.arange(width).expand(len(prompts), -1)
        prefill_hidden, _ = target(ids, positions, cache, causal_tree_mask(2, width, "cpu"))
        prefill_logits = target.logits(prefill_hidden)
        cache.lens.copy_(torch.tensor(PREFIXES, dtype=torch.int32))
        tree_positions = cache.lens.to(torch.int64).unsqueeze(1) + depth.to(torch.int64)
        tree_hidden, _ = target(tokens, tree_positions, cache, mask)
        tree_logits = target.logits(tree_hidden)

        for b, prompt in enumerate(prompts):
            decoder = Decoder(target, prompt, room=num_nodes)
            for t in range(len(prompt)):
                assert torch.equal(prefill_logits[b, t], decoder.logits[t]), \
                    ("prefill row", b, t, seed_note(gen))
            decoded = []  # node i's decoder: its parent's, one token further
            for node in range(num_nodes):
                parent = int(parents[b, node])
                branch = (decoded[parent] if parent >= 0 else decoder).fork()
                logits = branch.step(int(tokens[b, node]))
                decoded.append(branch)
                assert torch.equal(tree_logits[b, node], logits), \
                    ("tree node", b, node, shape, seed_note(gen))
