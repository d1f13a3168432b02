"""Answer a prompt with the default target model (SmolLM2-135M-Instruct), greedy decoding.

The project's main job for now: plain autoregressive greedy generation with transformers,
timed, followed by the report of which op backends this machine can run. A later issue turns
it into EAGLE speculative generation (whose greedy output must equal this one exactly).

    python python/generate.py --prompt "Why is the sky blue?" --max-new-tokens 64

Run it from the repository root after ``pip install -e .`` (or with ``PYTHONPATH=.``). The
first run converts the model's GGUF into ``$EAGLE_KERNELS_CACHE`` (about a minute).
"""

from __future__ import annotations

import argparse
import time

import torch

from eagle_kernels.ops._backend import backend_report
from eagle_kernels.runtime import load_default_model

DEFAULT_PROMPT = "What is speculative decoding, and why does it make language models faster?"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user's message")
    parser.add_argument("--max-new-tokens", type=int, default=128,
                        help="stop after this many generated tokens (default 128)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                        help="model dtype (default float32: the GGUF's exact weights)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be at least 1")
    return args


def render_prompt(tokenizer, prompt: str) -> torch.Tensor:
    """[1, T] int64 token ids of ``prompt`` as a user turn in the chat template, ready to answer."""
    messages = [{"role": "user", "content": prompt}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
    return encoded["input_ids"]


def greedy_generate(model, tokenizer, input_ids: torch.Tensor,
                    max_new_tokens: int) -> tuple[torch.Tensor, float]:
    """The new tokens [1, n] of a greedy continuation, and the wall time it took in seconds.

    A complete GenerationConfig of its own (rather than overrides of the checkpoint's) pins the
    decoding to plain greedy whatever generation_config.json says, and carries no sampling
    flags for transformers to warn about.
    """
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    input_ids = input_ids.to(model.device)
    _synchronize(model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                generation_config=config)
    _synchronize(model.device)
    return output[:, input_ids.shape[1]:].cpu(), time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":  # kernels run asynchronously: wait before reading the clock
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, tokenizer = load_default_model(dtype=DTYPES[args.dtype], device=args.device)
    input_ids = render_prompt(tokenizer, args.prompt)
    new_tokens, seconds = greedy_generate(model, tokenizer, input_ids, args.max_new_tokens)

    count = new_tokens.shape[1]
    print(f"prompt: {args.prompt}")
    print(f"reply:  {tokenizer.decode(new_tokens[0], skip_special_tokens=True).strip()}")
    print(f"{count} new tokens (prompt {input_ids.shape[1]} tokens) in {seconds:.2f} s: "
          f"{count / seconds:.1f} tokens/s, greedy, {args.dtype} on {model.device}")
    print(backend_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
