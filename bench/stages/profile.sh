#!/usr/bin/env bash
# Stage "profile": Nsight Compute on the kernels whose bars the last GPU run missed (tree
# attention at 4k context, the row-invariant Triton GEMM at 60 rows, chain acceptance, top-k;
# bench/profile_kernels.py):
# which unit or memory level limits each, the evidence the issue asks for beside a missed bar.
#   run(command="bash bench/gpu_suite.sh profile", carry=[".carry/build"])    (~2 minutes)
STAGE=profile
source "$(dirname "$0")/lib.sh"
environment
build_or_restore
if [ "$DRY_RUN" = 1 ]; then
  step ncu-left-out 60 "$PY" bench/profile_kernels.py --summarize "$WORK"
else
  step ncu 240 "$PY" bench/profile_kernels.py --out "$WORK/ncu"
  [ -f "$WORK/ncu/profile.txt" ] && cp "$WORK/ncu/profile.txt" "$WORK/summary-extra.txt"
fi
finish
