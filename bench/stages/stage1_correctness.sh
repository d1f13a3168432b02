#!/usr/bin/env bash
# Stage 1, the most valuable evidence: build, every kernel against the torch reference on the
# GPU (the verdict pass at every dtype, then the GPU tests), one compute-sanitizer memcheck
# pass, and the verdict table op x backend x dtype. Returns the build for later stages.
#   run(command="bash bench/gpu_suite.sh stage1")            (no carried paths)
STAGE=stage1
source "$(dirname "$0")/lib.sh"
environment
build_or_restore
step backends 60 "$PY" -c "import eagle_kernels; print(eagle_kernels.backend_report())"

# A rerun of what failed (after a harness fix; bench/README.md): EAGLE_SKIP_KERNEL_CHECK=1,
# EAGLE_GPU_TESTS="<test files>", EAGLE_MEMCHECK_OPS="<ops>" (default: all of each).
device=cuda; [ "$DRY_RUN" = 1 ] && device=cpu
[ "${EAGLE_SKIP_KERNEL_CHECK:-0}" = 1 ] || step kernel-check 90 "$PY" bench/sanitize_kernels.py \
  --device "$device" --verdict "$WORK/kernel-check.json"

# GPU tests only (-m gpu: nothing CPU-only collected). In the dry run they are collected and
# skip (no CUDA device), which proves the selection and the XML.
# Several workers where pytest-xdist is there: Triton compiles each kernel on the host's CPUs.
workers=(); [ "$DRY_RUN" = 0 ] && "$PY" -c "import xdist" 2>/dev/null && workers=(-n 8)
read -r -a gpu_tests <<< "${EAGLE_GPU_TESTS:-tests}"
for t in "${gpu_tests[@]}"; do  # the verdict lets a rerun replace whole test files only
  case $t in -*|*::*) echo "EAGLE_GPU_TESTS: whole test files or folders, got $t"; exit 2 ;; esac
done
memcheck_ops=(); for op in ${EAGLE_MEMCHECK_OPS:-}; do memcheck_ops+=(--op "$op"); done
# 1028 tests took 135 s on the H200 (2026-11-27); 1092 now, with more kernels to compile.
step gpu-tests 280 "$PY" -m pytest "${gpu_tests[@]}" -m gpu -q -rfEs -p no:cacheprovider \
  "${workers[@]}" --junitxml="$WORK/gpu-tests.xml"

if [ "$DRY_RUN" = 1 ]; then
  step memcheck-left-out 60 "$PY" -c "print('dry run: no compute-sanitizer')"
else
  # One process per op (a bad access kills the context, hiding the ops after it), four at once
  # (sanitize_kernels.MEMCHECK_WORKERS), each without the caching allocator: an access past a
  # tensor lands outside any allocation and is reported.
  step memcheck 150 "$PY" bench/sanitize_kernels.py --memcheck-each "$WORK/memcheck.tsv" \
    "${memcheck_ops[@]}"
fi

step verdict 30 "$PY" bench/verdict.py stage "$WORK" --table "$WORK/summary-extra.txt"
# A lease runs the later stages on this machine's build: nothing to carry back.
[ "${EAGLE_SKIP_PACK_BUILD:-0}" = 1 ] || step pack-build 60 "$PY" bench/stages/build_carry.py pack "$OUT"
finish
