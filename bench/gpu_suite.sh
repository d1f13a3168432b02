#!/usr/bin/env bash
# One call on a lent GPU (device tool): build the CUDA extension, run the GPU tests, run every
# kernel benchmark, and leave logs, CSV and PNG files in $OUT.
#
#   run(command="bash bench/gpu_suite.sh", carry=[".carry"])
#
# The GPU machine has torch, triton, nvcc, cmake and ninja but no network: pybind11 comes from
# a wheel carried along (make it here with `pip download --no-deps -d .carry/wheels pybind11`).
# The default model's GGUF is not needed: its tests are left out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/local}
mkdir -p "$OUT"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__)"
  nvcc --version | tail -1
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

python -c "import pybind11" 2>/dev/null || \
  python -m pip install --no-index --find-links .carry/wheels pybind11 > "$OUT/pybind11.log" 2>&1
if ! EAGLE_KERNELS_CUDA_ARCHS="${EAGLE_KERNELS_CUDA_ARCHS:-90a}" \
    python -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
  echo "build failed"; tail -40 "$OUT/build.log"; exit 1
fi
python -c "import eagle_kernels; print(eagle_kernels.backend_report())" | tee "$OUT/backends.txt"

python -m pytest tests -q -ra --ignore=tests/test_default_model.py \
  --junitxml="$OUT/tests.xml" > "$OUT/tests.log" 2>&1
echo "tests: exit $? ($(tail -1 "$OUT/tests.log"))"

for script in bench/kernels/bench_*.py; do
  [ -e "$script" ] || continue
  name=$(basename "$script" .py)
  python "$script" --out "$OUT" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"
  tail -25 "$OUT/$name.log"
done

# End to end: one speculative cycle vs one autoregressive step at Llama-3.1-8B shape (random
# bf16 weights, batch 1, context 1k, tree 60 / depth 7), torch reference ops and Triton kernels.
python bench/e2e/bench_cycle.py --out "$OUT" --contexts 1024 4096 > "$OUT/bench_cycle.log" 2>&1
echo "bench_cycle: exit $?"
tail -8 "$OUT/bench_cycle.log"
