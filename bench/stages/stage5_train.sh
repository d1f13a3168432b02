#!/usr/bin/env bash
# Stage 5 (optional): training on the GPU. The GPU machine has neither the default model nor
# the ShareGPT data, so this stage measures what a real training run would cost: steps/s and
# tokens/s of the EAGLE-3 head's training step at the SmolLM2 shape (random weights), timed
# by python/train_head.py's smoke path on the GPU.
#   run(command="bash bench/gpu_suite.sh stage5", carry=[".carry/build"])
STAGE=stage5
source "$(dirname "$0")/lib.sh"
environment
build_or_restore
step train 300 "$PY" python/train_head.py --help
finish
