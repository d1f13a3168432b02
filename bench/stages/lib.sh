# Shared by every GPU stage (sourced, never run): steps under their own timeouts inside the
# stage's budget, a results folder packed into one tarball plus a short summary in $OUT.
#
# A stage script sets STAGE (its name) and sources this file; then
#   step NAME SECONDS COMMAND...   runs COMMAND with stdout+stderr in $WORK/logs/NAME.log,
#                                  under `timeout -s INT` (pytest still writes its XML),
#                                  cut short to what is left of the stage's budget
#   finish                         writes $OUT/summary-$STAGE.txt and $OUT/$STAGE.tar.gz
# EAGLE_STAGE_DRY_RUN=1 (bash bench/gpu_suite.sh rehearse) runs the same steps at tiny sizes on
# CPU: no build, no sanitizer, no nvidia-smi; DRY_RUN is 1 then, else 0.
# EAGLE_STAGE_TAG (e.g. "b") names a second run of a stage on the same GPU (stage1b, ...), so
# bench/collect_results.py keeps both runs' evidence apart.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STAGE=$STAGE${EAGLE_STAGE_TAG:-}
PY=${PYTHON:-python3}
DRY_RUN=${EAGLE_STAGE_DRY_RUN:-0}
OUT=${OUT:-bench/results/local}
limit() { "$PY" bench/device_limits.py get "$1"; }
# bench/gpu_suite.sh lease sets both to share one run among the stages.
BUDGET_S=${EAGLE_STAGE_BUDGET_S:-$(limit STAGE_BUDGET_S)}
RESERVE_S=${EAGLE_PACK_RESERVE_S:-$(limit PACK_RESERVE_S)}
WORK=build/stage-work/$STAGE         # everything the tarball holds
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK/logs"
export TRITON_CACHE_DIR=$PWD/build/triton-cache
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # bench scripts import eagle_kernels from here
STAGE_START=$SECONDS
printf 'step\tstatus\tseconds\tlimit_s\n' > "$WORK/steps.tsv"

if [ "$DRY_RUN" = 1 ]; then
  export TRITON_INTERPRET=1
  echo "$STAGE: dry run (CPU rehearsal: tiny sizes, interpreter, no build/sanitizer)"
fi

# step NAME SECONDS COMMAND...: 0 if COMMAND succeeded in time.
step() {
  local name=$1 wanted=$2; shift 2
  local left=$((BUDGET_S - RESERVE_S - (SECONDS - STAGE_START)))
  local seconds=$(( wanted < left ? wanted : left ))
  if [ "$seconds" -lt 5 ]; then
    printf '%s\tnot run (stage budget spent)\t0\t%s\n' "$name" "$wanted" >> "$WORK/steps.tsv"
    echo "$name: not run (stage budget spent)"
    return 124
  fi
  local start=$SECONDS status
  timeout -s INT -k 15 "$seconds" "$@" > "$WORK/logs/$name.log" 2>&1
  status=$?
  local verdict=ok
  [ "$status" = 0 ] || verdict="exit $status"
  [ "$status" = 124 ] && verdict="timed out after ${seconds}s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$verdict" $((SECONDS - start)) "$seconds" >> "$WORK/steps.tsv"
  echo "$name: $verdict ($((SECONDS - start)) s)"
  return "$status"
}

# The machine, versions and commit: first lines of every summary.
environment() {
  {
    [ "$DRY_RUN" = 1 ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$PY" -c "import sys, torch; import triton; print('python', sys.version.split()[0], \
'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); \
print('gpu:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')"
    command -v nvcc > /dev/null && nvcc --version | tail -1
    # The device machine's .git can be older than the tree it was sent (seen on 2026-11-26):
    # the caller passes the commit it sent as EAGLE_COMMIT=<hash> in the command.
    if [ -n "${EAGLE_COMMIT:-}" ]; then echo "commit $EAGLE_COMMIT (sent by the caller)"
    else git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /;s/$/ (the .git there)/'; fi
  } > "$WORK/environment.txt" 2>&1
}

# Unpack the build of an earlier stage (carried as .carry/build) when it matches this source
# tree; else build here. Either way eagle_kernels._C ends up importable (on a GPU).
build_or_restore() {
  if [ "$DRY_RUN" = 1 ]; then
    step build 60 "$PY" -c "import eagle_kernels; print('dry run: the existing build')"
    return
  fi
  if [ "${EAGLE_LEASE_BUILT:-0}" = 1 ] && "$PY" -c "import eagle_kernels._C" 2>/dev/null; then
    step build 30 "$PY" -c "print('built by stage 1 of this lease, in place')"
    return
  fi
  if [ -f .carry/build/build.tar.gz ] && step restore-build 60 "$PY" bench/stages/build_carry.py restore; then
    return
  fi
  step build 300 env EAGLE_KERNELS_CUDA_ARCHS="${EAGLE_KERNELS_CUDA_ARCHS:-90a}" \
    "$PY" -m pip install --no-build-isolation --no-deps -e .
}

# Summary + tarball into $OUT; the summary is printed too (the reply shows the output's end).
finish() {
  local summary="$OUT/summary-$STAGE.txt"
  {
    echo "# $STAGE ($([ "$DRY_RUN" = 1 ] && echo 'dry run' || echo 'GPU run'), $((SECONDS - STAGE_START)) s)"
    cat "$WORK/environment.txt" 2>/dev/null
    echo
    column -t -s $'\t' "$WORK/steps.tsv" 2>/dev/null || cat "$WORK/steps.tsv"
    [ -f "$WORK/summary-extra.txt" ] && { echo; cat "$WORK/summary-extra.txt"; }
  } > "$summary"
  cp "$summary" "$WORK/"
  tar -czf "$OUT/$STAGE.tar.gz" -C "$(dirname "$WORK")" "$STAGE"
  cat "$summary"
  echo "files in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
}
