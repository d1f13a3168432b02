"""Generation with an EAGLE draft head: one prompt, streaming, a batch, sampling.

    python python/generate.py                 # SmolLM2-135M-Instruct + its bundled EAGLE-3 head
    python python/generate.py --smoke         # tiny random model, seconds, no model package
    python python/generate.py --hf DIR        # your own transformers model, loaded by you

Three ways in, one generator API (``generate`` / ``stream``):

* ``eagle_kernels.from_pretrained(target, draft)`` - a checkpoint directory or .gguf (None:
  the default model) and a head directory;
* ``eagle_kernels.from_hf(model, tokenizer, draft)`` - a transformers model you already
  loaded (Llama / Qwen2 / Mistral): the runtime shares its weight tensors, nothing is copied;
* ``--smoke`` - ``from_hf`` over a tiny random Llama with a random EAGLE-3 head.

Greedy output is exactly the target's own greedy output (checked below against
``speculative=False``); sampling keeps the target's distribution.
"""

from __future__ import annotations

import argparse
import time

import torch

import eagle_kernels
from eagle_kernels.runtime import TreeConfig

PROMPTS = ["Why is the sky blue?", "Write a haiku about autumn leaves.",
           "What is 17 times 23?"]


def parse_tree(text: str):
    return text if text == "auto" else TreeConfig(*(int(v) for v in text.split(",")))


def load(args):
    """An EagleGenerator for the chosen target."""
    if args.smoke:
        from tiny_models import byte_tokenizer, tiny_hf_model

        tokenizer = byte_tokenizer()
        model = tiny_hf_model(tokenizer, "llama", layers=7)  # stands in for AutoModelForCausalLM
        return eagle_kernels.from_hf(model, tokenizer, draft="random-eagle3",
                                     tree=TreeConfig(top_k=4, depth=3, total_tokens=12))
    if args.hf:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(args.hf)
        return eagle_kernels.from_hf(model, tokenizer, draft=args.draft, tree=args.tree)
    return eagle_kernels.from_pretrained(args.target, draft=args.draft, tree=args.tree)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny random model (CI)")
    parser.add_argument("--target", help="checkpoint dir or .gguf (default: SmolLM2-135M)")
    parser.add_argument("--hf", help="load this dir with transformers, then wrap it (from_hf)")
    parser.add_argument("--draft", help="EAGLE head dir (default: the bundled head)")
    parser.add_argument("--tree", default="auto", type=parse_tree,
                        help="'auto' (time this device) or TOP_K,DEPTH,TOTAL_TOKENS")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    new_tokens = 10 if args.smoke else args.max_new_tokens

    gen = load(args)

    # 1. one prompt, greedy: the target's exact output, fewer target passes
    start = time.perf_counter()
    out = gen.generate(PROMPTS[0], max_new_tokens=new_tokens)
    print(f"[greedy] {out.texts[0]!r}\n  tau={out.stats.tau:.2f} tokens per target pass, "
          f"{time.perf_counter() - start:.2f}s")
    plain = gen.generate(PROMPTS[0], max_new_tokens=new_tokens, speculative=False)
    assert out.tokens == plain.tokens, "greedy speculative output must equal autoregressive"
    print("  identical to autoregressive decoding: yes")

    # 2. streaming: text pieces as each draft/verify cycle commits tokens
    print("[stream] ", end="", flush=True)
    pieces = list(gen.stream(PROMPTS[0], max_new_tokens=new_tokens))
    for piece in pieces:
        print(piece, end="", flush=True)
    print(f"\n  {len(pieces)} pieces")
    assert out.texts[0].startswith("".join(pieces))  # a split multi-byte character waits

    # 3. a batch of prompts of different lengths, one tree per sequence
    batch = gen.generate(PROMPTS, max_new_tokens=new_tokens)
    for prompt, text, reason in zip(PROMPTS, batch.texts, batch.stop_reasons):
        print(f"[batch] {prompt!r} -> {text!r} ({reason})")
    print(f"  tau={batch.stats.tau:.2f}, {batch.stats.tokens_per_second:.1f} tokens/s")

    # 4. sampling: temperature / top-k / top-p of the target, seeded (lossless rejection sampling)
    sampled = gen.generate(PROMPTS[:2], max_new_tokens=new_tokens, temperature=0.8, top_p=0.95,
                           top_k=50, seed=1)
    again = gen.generate(PROMPTS[:2], max_new_tokens=new_tokens, temperature=0.8, top_p=0.95,
                         top_k=50, seed=1)
    assert sampled.tokens == again.tokens, "a seed fixes the sample"
    for text in sampled.texts:
        print(f"[sample] {text!r}")
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
