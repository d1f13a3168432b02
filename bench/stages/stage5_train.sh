#!/usr/bin/env bash
# Stage 5 (optional): train the EAGLE-3 head on the GPU, resumable across calls, and bring the
# head back in parts that fit the 16 MiB-per-file limit (bench/README.md, "Stage 5").
# The model travels as for stage 4 (parts calls first); the data travels tokenized: the
# dataset.pt that `python -m eagle_kernels train --prepare-only` wrote here (a few MB; the
# machine has no ShareGPT package) plus options.txt, the data options it was built with.
#   run(command="bash bench/gpu_suite.sh stage5",
#       carry=[".carry/model/part-<last>", ".carry/model/SHA256SUMS", ".carry/wheels",
#              ".carry/train", ".carry/build"])
# build/train-run/ survives while the machine stays warm: calling stage 5 again continues the
# same run (trainer_state.pt) for another TRAIN_MINUTES.
STAGE=stage5
source "$(dirname "$0")/lib.sh"
environment
build_or_restore
TRAIN_MINUTES=${TRAIN_MINUTES:-5}
RUN=build/train-run
head_back() {  # the exported head -> $OUT/head/ (parts + SHA256SUMS) and config into the tarball
  rm -rf "$WORK/head-root" && mkdir -p "$OUT/head" "$WORK/head"
  "$PY" bench/carry_model.py --root "$WORK/head-root" split --gguf "$1/model.safetensors" \
    --part-mib "$("$PY" bench/device_limits.py get RETURN_PART_MIB)" \
    && cp "$WORK/head-root/.carry/model/"* "$OUT/head/" \
    && cp "$1/config.json" "$1/train_log.jsonl" "$WORK/head/"
}
if [ "$DRY_RUN" = 1 ]; then
  # The trainer's options and the head's way back on a stand-in file: no model here.
  fake=build/stage-work/fake-head
  step train 60 "$PY" -m eagle_kernels train --help
  step head 60 bash -c "rm -rf $fake && mkdir -p $fake && head -c 300000 /dev/urandom \
    > $fake/model.safetensors && echo '{}' > $fake/config.json && touch $fake/train_log.jsonl \
    && $(declare -f head_back); WORK=$WORK OUT=$OUT PY=$PY head_back $fake"
else
  step wheels 60 "$PY" -m pip install -q --no-index --no-deps --find-links .carry/wheels gguf
  step model 120 bash -c "$PY bench/carry_model.py stash && $PY bench/carry_model.py join"
  gguf=$(tail -1 "$WORK/logs/model.log")
  read -r -a options < .carry/train/options.txt
  step train $((TRAIN_MINUTES * 60 + 120)) env EAGLE_KERNELS_GGUF="$gguf" "$PY" -m eagle_kernels \
    train --out "$RUN" --data-dir .carry/train "${options[@]}" --device cuda \
    --loss-backend triton --max-minutes "$TRAIN_MINUTES" --save-every 20
  step head 60 bash -c "$(declare -f head_back); WORK=$WORK OUT=$OUT PY=$PY head_back $RUN"
fi
finish
