#!/usr/bin/env bash
# Every batch size on the H200 in one call, from the repository root: install, autotune one
# megakernel per batch size, then time eager, torch-compile and the autotuned kernels side by side
# into $OUT/h200.json (merged into a copy of bench/results/h200.json) with the plot $OUT/h200.png;
# $OUT/autotune.json holds every variant timed.
# Usage: bash bench/h200_batches.sh [MODEL [BATCH_SIZES [JOBS]]]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-llama-3.2-1b}
batches=${2:-1,2,3,5,8,13,16,17,24,32,48,64}
jobs=${3:-12}
out=${OUT:-/tmp/megakernel-out}
tuned=/tmp/megakernel-tuned/$model
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
start=$(date +%s)
python3 -m megakernel autotune "$model" --batch-sizes "$batches" --max-seq-len 1024 \
  --classes 1 --jobs "$jobs" -o "$tuned"
echo "autotune: $(( $(date +%s) - start )) s for batch sizes $batches"
cp "$tuned/autotune.json" "$out/autotune.json"
cp bench/results/h200.json "$out/h200.json" 2>/dev/null || true
python3 -m megakernel bench decode --model "$model" --batch-sizes "$batches" --context 1024 \
  --backends eager,torch-compile,megakernel --kernels "$tuned" --json "$out/h200.json" \
  --plot "$out/h200.png"
