#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=.venv/bin/python
date
$PY -m eagle_kernels train --out runs/data-mix1200f --conversations 800 \
    --skip-conversations 7740 --code-prompts 400 --skip-code-prompts 2271 --regenerate \
    --turns 1 --regenerate-batch 32 --prepare-only --threads 2
date
$PY -m eagle_kernels train --out runs/head-mix1200f --data-dir runs/data-mix1200f \
    --conversations 800 --skip-conversations 7740 --code-prompts 400 \
    --skip-code-prompts 2271 --regenerate --turns 1 --regenerate-batch 32 \
    --init-from eagle_kernels/heads/smollm2-135m-instruct-eagle3 --epochs 2 --lr 4e-4 \
    --warmup-steps 10 --save-every 20 --threads 2 --max-minutes 40
date
$PY bench/e2e/bench_agreement.py --draft eagle_kernels/heads/smollm2-135m-instruct-eagle3 \
    --draft runs/head-mix1200f --sharegpt 100 --humaneval 100 --max-new-tokens 128 \
    --label mix1200f --out runs/agreement
date
