#!/usr/bin/env bash
# Every batch size on the H200, from the repository root, in stages that each fit one call:
#   bash bench/h200_batches.sh tune  [BATCH_SIZES]   install, autotune one megakernel per batch
#                                                    size into /tmp/megakernel-tuned/MODEL (then
#                                                    the same command again, warm, timed too);
#                                                    $OUT/autotune.json holds every variant timed
#   bash bench/h200_batches.sh bench [BATCH_SIZES]   eager, torch-compile and the tuned kernels
#                                                    side by side into $OUT/h200.json (merged into
#                                                    a copy of bench/results/h200.json) + h200.png;
#                                                    with LEDGER (an autotune.json, e.g. a tune
#                                                    call's $OUT copy) and no tuned folder (a fresh
#                                                    machine), the kernels are first built from
#                                                    its winners by one autotune run (nothing timed)
#   bash bench/h200_batches.sh all [BATCH_SIZES]     tune on GPU 0, then bench; with two GPUs the
#                                                    first half of the batch sizes on GPU 0 and the
#                                                    rest on GPU 1 at once ($OUT/bench-{a,b}.txt,
#                                                    rows $OUT/rows-{a,b}.json), merged in order;
#                                                    on one GPU about 262 + 9 + 330 s on an H100
#                                                    machine (tune and bench may run apart)
# TUNED (the kernels' folder), MODEL (default llama-3.2-1b), JOBS (build processes, default 12),
# CLASSES (schedule classes timed besides the default, default 2) and PRIOR (an earlier ledger
# whose final rounds' winners are timed too; default bench/results/autotune-MODEL.json where it
# exists, empty for none) come from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?tune, bench or all}
batches=${2:-1,2,3,5,8,13,16,17,24,32,48,64}
model=${MODEL:-llama-3.2-1b}
out=${OUT:-/tmp/megakernel-out}
tuned=${TUNED:-/tmp/megakernel-tuned/$model}
prior=${PRIOR-bench/results/autotune-$model.json}
[ -f "$prior" ] || prior=
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# one install at a time: two stages started side by side (one per GPU) would race in pip
lock=(); command -v flock >/dev/null && lock=(flock /tmp/megakernel-install.lock)
${lock[@]+"${lock[@]}"} python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e . 2>&1 | tail -2
tune() {  # autotune every batch size into $tuned (then once more: the warm rerun's time; RUNS
          # "first" for one run); the ledger is copied to $out even when a run fails or stops
  local start run
  trap 'cp "$tuned/autotune.json" "$out/autotune.json" 2>/dev/null || true' EXIT
  for run in ${RUNS:-first warm}; do
    start=$(date +%s)
    python3 -m megakernel autotune "$model" --batch-sizes "$batches" --max-seq-len 1024 \
      --classes "${CLASSES:-2}" --jobs "${JOBS:-12}" -o "$tuned" ${prior:+--prior "$prior"}
    echo "autotune ($run run): $(( $(date +%s) - start )) s for batch sizes $batches"
  done
}
bench_rows() {  # BATCH_SIZES JSON [PLOT]: the three backends side by side, rows merged into JSON
  python3 -m megakernel bench decode --model "$model" --batch-sizes "$1" --context 1024 \
    --backends eager,torch-compile,megakernel --kernels "$tuned" --json "$2" ${3:+--plot "$3"}
}
case "$stage" in
  tune) tune ;;
  bench)
    if [ -n "${LEDGER:-}" ] && [ ! -f "$tuned/autotune.json" ]; then
      mkdir -p "$tuned" && cp "$LEDGER" "$tuned/autotune.json" && RUNS=first tune
    fi
    [ -f "$out/h200.json" ] || cp bench/results/h200.json "$out/h200.json" 2>/dev/null || true
    bench_rows "$batches" "$out/h200.json" "$out/h200.png" ;;
  all)
    CUDA_VISIBLE_DEVICES=0 tune
    IFS=, read -ra list <<< "$batches"
    halves=("$batches")
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && [ "${#list[@]}" -ge 2 ]; then
      n=$(( (${#list[@]} + 1) / 2 ))
      halves=("$(IFS=,; echo "${list[*]:0:n}")" "$(IFS=,; echo "${list[*]:n}")")
    fi
    rm -f "$out"/rows-[ab].json
    parts=(a b)
    for i in "${!halves[@]}"; do    # fresh files: no stale row of the other half comes back
      CUDA_VISIBLE_DEVICES=$i bench_rows "${halves[$i]}" "$out/rows-${parts[$i]}.json" \
        > "$out/bench-${parts[$i]}.txt" 2>&1 &
    done
    wait
    tail -n 20 "$out"/bench-*.txt
    cp bench/results/h200.json "$out/h200.json" 2>/dev/null || true
    python3 -m megakernel.bench.results "$out/h200.json" "$out"/rows-*.json \
      --plot "$out/h200.png" ;;
  *) echo "stage must be tune, bench or all" >&2; exit 2 ;;
esac
