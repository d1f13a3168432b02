"""Helpers for runtime tests: a tiny random target, an oracle draft head, real chat prompts."""

from __future__ import annotations

import zlib

import torch

from eagle_kernels.runtime.draft_heads import EAGLE3, Eagle3Head, new_draft_head
from eagle_kernels.runtime.model import TargetModel

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis to a ten-year-old.",
    "Give me three tips for a job interview.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 times 23? Show your steps.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "List the planets of the solar system in order.",
    "How do I make a cup of tea?",
    "What are the benefits of regular exercise?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is and when to use one.",
    "What causes earthquakes?",
    "Suggest a name for a small bakery.",
    "Describe the water cycle.",
    "What is the difference between weather and climate?",
    "Write a short email asking for a meeting next week.",
    "How does a bicycle stay upright?",
    "Tell me a fun fact about octopuses.",
]


def tiny_target(seed: int = 0, vocab: int = 300, layers: int = 7,
                head_dim: int = 16) -> TargetModel:
    """A random 7-layer (the fewest EAGLE-3 accepts) Llama (GQA 4/2, head_dim 16) in fp32 on CPU:
    fast loop tests. ``head_dim=64`` for the cuda attention kernel (it takes 64 or 128 only)."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=vocab, hidden_size=4 * head_dim, intermediate_size=8 * head_dim,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, eos_token_id=vocab - 1, bos_token_id=0,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = TargetModel(config).eval()
    with torch.no_grad():  # larger logits: fewer near-ties, more decisive distributions
        model.lm_head.weight.mul_(8.0)
    return model


class OracleHead(Eagle3Head):
    """A real EAGLE-3 head whose logits are pushed towards a known continuation.

    ``reference[b]`` is sequence b's greedy autoregressive output (prompt included). A head
    output that predicts target position q gets +``boost`` on ``reference[b][q]`` for most
    (position, sequence) pairs (a fixed hash picks which), so drafts are accepted often but
    not always: acceptance, KV compaction and multi-token commits all get exercised, and the
    target alone still decides every token.
    """

    boost = 40.0
    hit_rate = 0.8

    @classmethod
    def wrap(cls, head: Eagle3Head, reference: list[list[int]]) -> "OracleHead":
        head.__class__ = cls
        head.reference = reference
        head._boosted = {}  # device -> [B, L] int64: the boosted token per position, or -1
        return head

    def forward(self, tokens, hidden, positions, cache, tree_mask, tree_offset: int = 0):
        self._cache, self._positions = cache, positions
        return super().forward(tokens, hidden, positions, cache, tree_mask, tree_offset)

    def _boosted_tokens(self, device: torch.device) -> torch.Tensor:
        """reference[b][q] where the hash picks (b, q), else -1; a device table, so boosting
        reads no value on the host and the cycle stays capturable in a CUDA graph (first
        built in the eager warm-up runs that precede a capture)."""
        if device not in self._boosted:
            width = max(len(ref) for ref in self.reference)
            table = [[ref[q] if q < len(ref) and
                      zlib.crc32(f"{b}:{q}".encode()) % 1000 < self.hit_rate * 1000 else -1
                      for q in range(width)] for b, ref in enumerate(self.reference)]
            self._boosted[device] = torch.tensor(table, dtype=torch.int64, device=device)
        return self._boosted[device]

    def draft_logits(self, out_hidden):
        logits = super().draft_logits(out_hidden)
        if out_hidden.dim() == 2:  # the root's children: predicted position lens + 1
            targets = (self._cache.lens.to(torch.int64) + 1).unsqueeze(1)
            rows = logits.unsqueeze(1)
        else:  # frontier at head position p predicts target position p + 2
            targets = self._positions.to(torch.int64) + 2
            rows = logits
        table = self._boosted_tokens(logits.device)[:rows.shape[0]]
        inside = (targets >= 0) & (targets < table.shape[1])
        token = table.gather(1, targets.clamp(0, table.shape[1] - 1))
        boost = ((token >= 0) & inside).to(rows.dtype) * self.boost  # 0 adds nothing
        rows.scatter_add_(2, token.clamp(min=0).unsqueeze(-1), boost.unsqueeze(-1))
        return logits


def oracle_head(target: TargetModel, reference: list[list[int]], seed: int = 0) -> OracleHead:
    return OracleHead.wrap(new_draft_head(EAGLE3, target, seed=seed), reference)
