python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export MEGAKERNEL_CACHE=/tmp/mkcache PYTHONUNBUFFERED=1
rm -f /tmp/tuned.done
(export CUDA_VISIBLE_DEVICES=0
 JOBS=24 OUT=/tmp/a bash bench/h200_batches.sh tune; touch /tmp/tuned.done
 cp /tmp/a/autotune.json $OUT/autotune.json
 OUT=/tmp/a bash bench/h200_batches.sh bench 1,2,3,5,8,13; cp /tmp/a/h200.json $OUT/h200-a.json) > $OUT/gpu0.txt 2>&1 &
(export CUDA_VISIBLE_DEVICES=1
 timeout 200 python3 -m megakernel autotune llama-3.1-8b --batch-sizes 1 --max-seq-len 1024 --classes 2 --jobs 6 -o /tmp/tuned-8b
 cp /tmp/tuned-8b/autotune.json $OUT/autotune-8b.json
 timeout 120 python3 -m megakernel bench decode --model llama-3.1-8b --batch-sizes 1 --context 1024 --backends torch-compile,megakernel --kernels /tmp/tuned-8b --json $OUT/h200-8b.json
 while [ ! -f /tmp/tuned.done ]; do sleep 2; done
 OUT=/tmp/b bash bench/h200_batches.sh bench 16,17,24,32,48,64; cp /tmp/b/h200.json $OUT/h200-b.json) > $OUT/gpu1.txt 2>&1 &
wait
grep -v Warn $OUT/gpu0.txt | tail -30; grep -v Warn $OUT/gpu1.txt | tail -30
