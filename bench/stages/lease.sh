#!/usr/bin/env bash
# Stages 1-3 in one run of the device tool, for a lease too short for a cold start per stage
# (15 minutes of device time in all): one build in place, stage 2 reuses stage 1's kernel check,
# and each stage's budget is what is left of SECONDS minus a floor kept for the stages after it.
#   run(command="bash bench/gpu_suite.sh lease 540", timeout_s=570)    (no carried paths)
# $OUT ends with stage 1's three files and stages 2-3's two each (7 of the 8 that come back).
# A second lease on the same GPU: EAGLE_STAGE_TAG=b (stage1b, ...; lib.sh), and
# EAGLE_BENCH_FAMILIES / EAGLE_CYCLE_BACKENDS to rerun only what failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
total=${1:-540}
deadline=$((SECONDS + total))
export EAGLE_PACK_RESERVE_S=${EAGLE_PACK_RESERVE_S:-15}
# stage NAME MOST FLOOR_AFTER: run NAME with at most MOST seconds, keeping FLOOR_AFTER for later.
stage() {
  local left=$((deadline - SECONDS - $3))
  local budget=$(( $2 < left ? $2 : left ))
  echo "== $1: budget ${budget}s of ${total}s"
  EAGLE_STAGE_BUDGET_S=$budget bash "bench/gpu_suite.sh" "$1"
}
# Floors shrink with a shorter lease: stage 1's evidence comes first.
stage stage1 330 $(( total * 3 / 10 < 220 ? total * 3 / 10 : 220 ))
export EAGLE_LEASE_BUILT=1
stage stage2 150 $(( total / 5 < 110 ? total / 5 : 110 ))
# No verdict of this GPU is committed yet, so auto would run the torch reference twice.
export EAGLE_CYCLE_BACKENDS=${EAGLE_CYCLE_BACKENDS:-torch triton cuda}
stage stage3 300 0
