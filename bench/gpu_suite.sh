#!/usr/bin/env bash
# The GPU evidence, in stages: each one run of the device tool that starts on a cold machine,
# finishes inside bench/device_limits.py's STAGE_BUDGET_S (every step under its own timeout)
# and leaves one tarball plus a short summary in $OUT. Most valuable first:
#
#   bash bench/gpu_suite.sh stage1   build; every kernel vs the torch reference; GPU tests;
#                                    memcheck; verdict op x backend x dtype; returns the build
#   bash bench/gpu_suite.sh stage2   kernel microbenchmarks (+ verdict with speedups)
#   bash bench/gpu_suite.sh stage3   cycle vs AR step, Llama-3.1-8B and SmolLM2 shapes
#   bash bench/gpu_suite.sh stage4   optional: the real default model (carried in parts)
#   bash bench/gpu_suite.sh stage5   optional: training (placeholder, see the script)
#   bash bench/gpu_suite.sh profile  Nsight Compute on the kernels whose bars were missed
#   bash bench/gpu_suite.sh lease SECONDS   stages 1-3 in one run of SECONDS on one machine
#                                    (a lease too short for a cold start per stage): stage 1
#                                    builds in place, stage 2 reuses its check, budgets shared
#   bash bench/gpu_suite.sh rehearse every stage as a CPU dry run, with the device's limits
#                                    checked (CI: tests/test_gpu_suite.py)
#
# What to carry and commit for each: bench/README.md. Results: bench/collect_results.py.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
case "$stage" in
  stage1) exec bash bench/stages/stage1_correctness.sh ;;
  stage2) exec bash bench/stages/stage2_kernels.sh ;;
  stage3) exec bash bench/stages/stage3_cycle.sh ;;
  stage4) exec bash bench/stages/stage4_model.sh ;;
  stage5) exec bash bench/stages/stage5_train.sh ;;
  profile) exec bash bench/stages/profile.sh ;;
  lease) exec bash bench/stages/lease.sh "${2:-540}" ;;
  rehearse) shift; exec "${PYTHON:-python3}" bench/stages/rehearse.py "$@" ;;
  *) sed -n '2,21p' "$0"; exit 2 ;;
esac
