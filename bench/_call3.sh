python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export MEGAKERNEL_CACHE=/tmp/mkcache PYTHONUNBUFFERED=1
TUNED=/tmp/mkcache/autotune/llama-3.2-1b JOBS=16 OUT=$OUT bash bench/h200_batches.sh tune 2>&1 | grep -v Warn | tr '\r' '\n' | grep -v "it/s\]$\|s/it\]$" > $OUT/tune.txt
tail -45 $OUT/tune.txt
