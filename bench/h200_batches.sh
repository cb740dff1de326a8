#!/usr/bin/env bash
# Every batch size on the H200, from the repository root, in two stages that each fit one call:
#   bash bench/h200_batches.sh tune  [BATCH_SIZES]   install, autotune one megakernel per batch
#                                                    size into /tmp/megakernel-tuned/MODEL;
#                                                    $OUT/autotune.json holds every variant timed
#   bash bench/h200_batches.sh bench [BATCH_SIZES]   eager, torch-compile and the tuned kernels
#                                                    side by side into $OUT/h200.json (merged into
#                                                    a copy of bench/results/h200.json) + h200.png
# TUNED (the kernels' folder), MODEL (default llama-3.2-1b), JOBS (build processes, default 12)
# and CLASSES (schedule classes timed besides the default, default 2) come from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?tune or bench}
batches=${2:-1,2,3,5,8,13,16,17,24,32,48,64}
model=${MODEL:-llama-3.2-1b}
out=${OUT:-/tmp/megakernel-out}
tuned=${TUNED:-/tmp/megakernel-tuned/$model}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# one install at a time: two stages started side by side (one per GPU) would race in pip
lock=(); command -v flock >/dev/null && lock=(flock /tmp/megakernel-install.lock)
${lock[@]+"${lock[@]}"} python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e . 2>&1 | tail -2
case "$stage" in
  tune)
    start=$(date +%s)
    python3 -m megakernel autotune "$model" --batch-sizes "$batches" --max-seq-len 1024 \
      --classes "${CLASSES:-2}" --jobs "${JOBS:-12}" -o "$tuned"
    echo "autotune: $(( $(date +%s) - start )) s for batch sizes $batches"
    cp "$tuned/autotune.json" "$out/autotune.json" ;;
  bench)
    [ -f "$out/h200.json" ] || cp bench/results/h200.json "$out/h200.json" 2>/dev/null || true
    python3 -m megakernel bench decode --model "$model" --batch-sizes "$batches" --context 1024 \
      --backends eager,torch-compile,megakernel --kernels "$tuned" --json "$out/h200.json" \
      --plot "$out/h200.png" ;;
  *) echo "stage must be tune or bench" >&2; exit 2 ;;
esac
