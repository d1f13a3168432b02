#!/usr/bin/env bash
# Stage 4 (optional): the real default model on the GPU, end to end (ours-ar, ours-eagle and
# transformers baselines on carried prompts; the official EAGLE code beside them where it was
# carried). Its GGUF travels in parts, one per call (bench/README.md); this stage is the last
# call: it stashes the last part, joins and runs.
#   run(command="bash bench/gpu_suite.sh stage4",
#       carry=[".carry/model/part-NN", ".carry/model/SHA256SUMS", ".carry/wheels",
#              ".carry/prompts", ".carry/build", ".carry/official-eagle"])
# A projected GPU speedup needs no model here: τ (measured on CPU, bench/results/*/tau*.json)
# x AR step / cycle time (stage 3's SmolLM2 rows in cycle.csv), which bench/make_results.py
# writes into RESULTS.md ("Projected speedup") for every run with a cycle.csv.
STAGE=stage4
source "$(dirname "$0")/lib.sh"
environment
build_or_restore
if [ "$DRY_RUN" = 1 ]; then
  # The carry round trip on a stand-in file, and the benchmark's arguments: no model here.
  fake=build/stage-work/fake-root
  step model 60 bash -c "rm -rf $fake && mkdir -p $fake && head -c 300000 /dev/urandom > $fake/m.gguf \
    && $PY bench/carry_model.py --root $fake split --gguf $fake/m.gguf --part-mib 0.1 \
    && $PY bench/carry_model.py --root $fake stash && $PY bench/carry_model.py --root $fake join"
  step e2e 60 "$PY" bench/e2e/bench_e2e.py --help
  step official 60 "$PY" bench/e2e/bench_official_eagle.py --help
else
  step wheels 60 "$PY" -m pip install -q --no-index --no-deps --find-links .carry/wheels gguf
  step model 120 bash -c "$PY bench/carry_model.py stash && $PY bench/carry_model.py join"
  gguf=$(tail -1 "$WORK/logs/model.log")
  sets=(.carry/prompts/*.jsonl)
  step e2e 300 env EAGLE_KERNELS_GGUF="$gguf" "$PY" bench/e2e/bench_e2e.py --sets "${sets[@]}" \
    --prompts 10 --max-new-tokens 128 --dtype bfloat16 --out "$WORK/e2e"
  # Where the official EAGLE code was carried (bench/README.md), the same model beside it.
  official=.carry/official-eagle
  if [ -f "$official/eagle/model/ea_model.py" ]; then
    step official 300 env EAGLE_KERNELS_GGUF="$gguf" "$PY" bench/e2e/bench_official_eagle.py \
      --official-eagle "$official" --official-commit "$(cat "$official/COMMIT" 2> /dev/null || echo unknown)" \
      --sets "${sets[@]}" --prompts 8 --dtype bfloat16 --device cuda --out "$WORK/official"
  fi
fi
finish
