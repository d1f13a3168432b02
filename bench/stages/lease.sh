#!/usr/bin/env bash
# Stages (1-3 unless EAGLE_LEASE_STAGES says) in one run of the device tool, for a lease too
# short for a cold start per stage (15 minutes of device time in all): one build in place,
# stage 2 reuses stage 1's kernel check, and each stage's budget is what is left of SECONDS
# minus a floor kept for the stages after it.
#   run(command="bash bench/gpu_suite.sh lease 540", timeout_s=570)    (no carried paths)
# $OUT ends with two files per stage (tarball, summary): up to 4 stages fit the 8 that come back
# (no build tarball: the stages share this machine's build).
# A second lease on the same GPU: EAGLE_STAGE_TAG=b (stage1b, ...; lib.sh), and
# EAGLE_BENCH_FAMILIES / EAGLE_CYCLE_BACKENDS to rerun only what failed; a GPU proven before:
#   EAGLE_LEASE_STAGES="stage2 profile stage3" \
#   EAGLE_BENCH_FAMILIES="acceptance topk kv attention decoder" bash bench/gpu_suite.sh lease 540
# then python3 bench/collect_results.py --proof-from bench/results/<its proven run> <files_at>.
set -uo pipefail
cd "$(dirname "$0")/../.."
total=${1:-540}
deadline=$((SECONDS + total))
export EAGLE_PACK_RESERVE_S=${EAGLE_PACK_RESERVE_S:-15}
export EAGLE_SKIP_PACK_BUILD=1
# EAGLE_LEASE_STAGES: which stages, in order (default stage1 stage2 stage3). On a GPU whose
# committed verdict already proves every kernel, e.g. "stage2 profile stage3": the first stage
# builds in place and the others reuse its build.
read -ra stages <<< "${EAGLE_LEASE_STAGES:-stage1 stage2 stage3}"
if [ "${#stages[@]}" -gt 4 ]; then  # two files each; the device tool brings back 8
  echo "EAGLE_LEASE_STAGES: at most 4 stages, got ${stages[*]}"; exit 2
fi
BUILD_S=100  # a first stage other than stage 1 builds and checks (H200, 2026-11-28b: 56 + 39 s)
# What a stage takes on a cold H100 / H200 (2026-11-26 / 27): stage 1 ~355 s (build 63, check 27,
# GPU tests 139, memcheck of 14 ops 115), stage 2 ~155 s, stage 3 ~250 s: more than one 600 s
# call, so a lease that must prove kernels runs EAGLE_LEASE_STAGES="stage1 stage2" first, then on
# the warm machine: EAGLE_LEASE_BUILT=1 EAGLE_STAGE_BUDGET_S=<s> bash bench/gpu_suite.sh stage3.
# Since then: 1092 GPU tests (more kernels to compile), memcheck of 18 ops four at a time; on
# the H200 stage 2's five families take ~210 s after its build and check (acceptance 43, top-k
# 64, KV 13 on 2026-11-28; decoder 24, attention 63 on 2026-11-28b; their new variants
# triton_fused_sum and triton_pm* add some 30 s), stage 3 195 s, the profile 94 s
# (2026-11-28b): a lease of "stage2 stage3" (a GPU whose verdict still proves every kernel's
# digest: collect with --proof-from) fits 560 s.
most() { case $1 in stage1) echo 420 ;; stage2) echo 260 ;; profile) echo 150 ;; *) echo 300 ;; esac; }
# The floor a stage keeps for itself while those before it run; shrinks with a shorter lease.
floor() {
  case $1 in
    stage1) echo 0 ;;
    stage2) echo $(( total / 10 < 110 ? total / 10 : 110 )) ;;
    profile) echo $(( total / 10 < 90 ? total / 10 : 90 )) ;;
    *) echo $(( total / 5 < 110 ? total / 5 : 110 )) ;;
  esac
}
# auto left out: on a GPU no verdict proves it is torch (timed twice); on a proven GPU add it
# (EAGLE_CYCLE_BACKENDS="auto torch triton cuda") to time what auto picks there.
export EAGLE_CYCLE_BACKENDS=${EAGLE_CYCLE_BACKENDS:-torch triton cuda}
for i in "${!stages[@]}"; do
  name=${stages[$i]} after=0
  for later in "${stages[@]:$((i + 1))}"; do after=$((after + $(floor "$later"))); done
  left=$((deadline - SECONDS - after))
  most=$(most "$name")
  [ "$i" = 0 ] && [ "$name" != stage1 ] && most=$((most + BUILD_S))
  budget=$(( most < left ? most : left ))
  echo "== $name: budget ${budget}s of ${total}s"
  EAGLE_STAGE_BUDGET_S=$budget bash "bench/gpu_suite.sh" "$name"
  export EAGLE_LEASE_BUILT=1  # built in place by the first stage: the others reuse it
done
