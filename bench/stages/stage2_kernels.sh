#!/usr/bin/env bash
# Stage 2: kernel microbenchmarks, every family: speedup over torch and fraction of the memory
# floor (columns op, backend, dtype, median_us, speedup_vs_torch, x_floor, floor_fraction),
# then this stage's verdict (correctness re-checked here, so the speedups sit beside it).
#   run(command="bash bench/gpu_suite.sh stage2", carry=[".carry/build"])
# (.carry/build: build.tar.gz from stage 1; without it this stage builds first.)
STAGE=stage2
source "$(dirname "$0")/lib.sh"
environment
build_or_restore
smoke=(); [ "$DRY_RUN" = 1 ] && smoke=(--smoke)
device=cuda; [ "$DRY_RUN" = 1 ] && device=cpu
checked=build/stage-work/stage1${EAGLE_STAGE_TAG:-}/kernel-check.json
# a tagged rerun of stage 2 (stage2b) on the machine whose untagged stage 1 just built and
# checked, when no stage 1 of its own tag ran (one that ran and failed is not replaced)
[ -d "${checked%/*}" ] || checked=build/stage-work/stage1/kernel-check.json
if [ "${EAGLE_LEASE_BUILT:-0}" = 1 ] && [ -f "$checked" ]; then
  # One lease, one GPU: stage 1's check a minute ago is this stage's correctness evidence.
  step kernel-check 10 cp "$checked" "$WORK/kernel-check.json"
else
  step kernel-check 90 "$PY" bench/sanitize_kernels.py --device "$device" \
    --verdict "$WORK/kernel-check.json"
fi
# EAGLE_BENCH_FAMILIES: a subset (a rerun of the families whose benchmark failed before).
# The families whose speedups decide auto first (acceptance, top-k, KV: a stage cut short keeps
# them); the decoder's and attention's Triton kernels join auto as row-invariant ones anyway.
for family in ${EAGLE_BENCH_FAMILIES:-acceptance topk kv decoder attention}; do
  seconds=75; [ "$family" = attention ] && seconds=90  # + its Triton variants (~15 s on an H100)
  step "bench_$family" "$seconds" "$PY" "bench/kernels/bench_$family.py" --out "$WORK/kernels" \
    "${smoke[@]}"
done
step verdict 30 "$PY" bench/verdict.py stage "$WORK" --table "$WORK/summary-extra.txt"
finish
