#!/usr/bin/env bash
# Stage 3: one speculative cycle against one autoregressive step at Llama-3.1-8B and SmolLM2
# shapes (random bf16 weights, CUDA graphs) for each backend, with the roofline ratio.
#   run(command="bash bench/gpu_suite.sh stage3", carry=[".carry/build"])
STAGE=stage3
source "$(dirname "$0")/lib.sh"
environment
build_or_restore
if [ "$DRY_RUN" = 1 ]; then
  step cycle-smoke 120 "$PY" bench/e2e/bench_cycle.py --smoke --out "$WORK/cycle"
else
  # EAGLE_CYCLE_STEPS: a subset of the steps below by name (a second call on a warm machine
  # finishing what a cut stage left, e.g. "cycle-batch-smollm2 cycle-llama-4k"; with
  # EAGLE_STAGE_TAG=b, so its stage3b does not replace the first call's stage3); all by default.
  steps="cycle-llama cycle-smollm2 cycle-batch cycle-batch-smollm2 cycle-llama-4k"
  for name in ${EAGLE_CYCLE_STEPS:-}; do
    [[ " $steps " == *" $name "* ]] || { echo "EAGLE_CYCLE_STEPS: no step $name ($steps)"; exit 2; }
  done
  # step NAME ... where EAGLE_CYCLE_STEPS chose NAME (or chose none)
  cycle_step() { [ -z "${EAGLE_CYCLE_STEPS:-}" ] || [[ " $EAGLE_CYCLE_STEPS " == *" $1 "* ]] \
    && step "$@"; }
  # The bar's shape first: a short budget (bench/gpu_suite.sh lease) still measures it.
  read -ra backends <<< "${EAGLE_CYCLE_BACKENDS:-auto torch triton cuda}"
  cycle_step cycle-llama 180 "$PY" bench/e2e/bench_cycle.py --shape llama3.1-8b \
    --backends "${backends[@]}" --contexts 1024 --out "$WORK/cycle"
  cycle_step cycle-smollm2 90 "$PY" bench/e2e/bench_cycle.py --shape smollm2-135m \
    --backends "${backends[@]}" --contexts 1024 --out "$WORK/cycle"
  # Batch (the issue's bar: where the ratio stands at batch 8 and 32, both shapes): each at the
  # tree the tree budget picks for that batch at acceptance 0.7 (an assumption: random weights
  # accept nothing; the EAGLE papers report ~0.7-0.8 on 7-8B targets). The budget times every
  # candidate tree, so one backend (EAGLE_BATCH_BACKENDS; the lossless triton path by default:
  # two backends did not finish batch 8 and 32 in 61 s on the H200, 2026-11-28).
  read -ra batch_backends <<< "${EAGLE_BATCH_BACKENDS:-triton}"
  cycle_step cycle-batch 150 "$PY" bench/e2e/bench_cycle.py --shape llama3.1-8b \
    --backends "${batch_backends[@]}" --contexts 1024 --batches 8 32 --budget-alpha 0.7 \
    --out "$WORK/cycle"
  cycle_step cycle-batch-smollm2 90 "$PY" bench/e2e/bench_cycle.py --shape smollm2-135m \
    --backends "${batch_backends[@]}" --contexts 1024 --batches 8 32 --budget-alpha 0.7 \
    --out "$WORK/cycle"
  cycle_step cycle-llama-4k 120 "$PY" bench/e2e/bench_cycle.py --shape llama3.1-8b \
    --backends "${backends[@]}" --contexts 4096 --out "$WORK/cycle"
fi
step cycle-table 30 "$PY" bench/stages/cycle_table.py "$WORK/cycle/cycle.csv" \
  --write "$WORK/summary-extra.txt"
finish
