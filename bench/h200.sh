#!/usr/bin/env bash
# The whole benchmark on the H200 in one call, from the repository root:
#   install megakernel into the machine's python (carried wheels in .whl/ first, if any),
#   run the GPU correctness tests (on a second GPU, at the same time, when the machine has two),
#   time every backend side by side and merge the rows into
#   $OUT/h200.json (a copy of bench/results/h200.json) with a plot $OUT/h200.png.
# Usage: bash bench/h200.sh [MODEL [BATCH_SIZES [BACKENDS]]]
# SWEEP=VARIANTS (comma-separated labels) also times those variants beside torch-compile and
# checks each against eager, after the bench, at batch 1 or at SWEEP_BATCHES (e.g. 1,17,64)
# ($OUT/sweep.json; its kernels built first in JOBS processes, default 12); CHECKS=0 skips the
# tests and memcheck; TRACE_BATCHES="1 17 64" traces those batch sizes (default 1:
# timeline-b1.png, trace-b1.txt with the phase table, trace.json; each traced kernel is built on
# its own: 1-4 minutes apiece from 17 rows on, while the tests run beside).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-llama-3.2-1b}
batches=${2:-1,8,32}
backends=${3:-eager,torch-compile,megakernel}
out=${OUT:-/tmp/megakernel-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
checks() {  # GPU correctness tests and memcheck; on a second GPU, beside the timings, when there is one
  local rc=0
  python3 -m pytest -q -s -m gpu tests > "$out/gpu-tests.log" 2>&1 || rc=$?
  compute-sanitizer --tool memcheck python3 -m megakernel.bench.sanitize_step > "$out/memcheck.log" 2>&1 \
    || echo "memcheck FAILED" >> "$out/memcheck.log"
  return "$rc"
}
report_checks() {
  grep -E "rel err|passed|failed" "$out/gpu-tests.log" | tail -20
  tail -3 "$out/memcheck.log"
}
tests_rc=0
gpus=$(nvidia-smi -L | wc -l)
if [ "${CHECKS:-1}" = 0 ]; then
  gpus=1                                     # timings only: no tests, nothing to wait for
elif [ "$gpus" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=$((gpus - 1)); checks) & checks_pid=$!
  export CUDA_VISIBLE_DEVICES=0
else
  checks || tests_rc=$?
  report_checks
fi
for b in ${TRACE_BATCHES:-1}; do           # timelines and phase tables (stamps of batch 1 as json)
  json=(); [ "$b" = 1 ] && json=(--json "$out/trace.json")
  python3 -m megakernel trace --model "$model" --batch-size "$b" -o "$out/timeline-b$b.png" \
    ${json[@]+"${json[@]}"} > "$out/trace-b$b.txt" 2>&1 || echo "trace at batch $b FAILED"
  tail -22 "$out/trace-b$b.txt"
done
cp bench/results/h200.json "$out/h200.json" 2>/dev/null || true
python3 -m megakernel bench decode --model "$model" --batch-sizes "$batches" --context 1024 \
  --backends "$backends" --json "$out/h200.json" --plot "$out/h200.png"
if [ -n "${SWEEP:-}" ]; then
  python3 -m megakernel.bench.sweep --model "$model" --batch-sizes "${SWEEP_BATCHES:-1}" --variants "$SWEEP" \
    --jobs "${JOBS:-12}" --json "$out/sweep.json" 2>&1 | grep -E " ms |failed" || echo "sweep FAILED"
fi
if [ "$gpus" -ge 2 ]; then wait "$checks_pid" || tests_rc=$?; report_checks; fi
[ "$tests_rc" = 0 ] || { echo "GPU tests FAILED (rc=$tests_rc), see gpu-tests.log"; exit "$tests_rc"; }
