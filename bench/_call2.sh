python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export MEGAKERNEL_CACHE=/tmp/mkcache PYTHONUNBUFFERED=1
W17=64x256x8x132xs3xkv1024xq2xkb128xbalxnfxrnx
W24=64x256x8x132xs3xsm200xkv1024xq2xkb128xnfxrnx
python3 -m megakernel.bench.sweep --batch-sizes 17 --jobs 8 --json $OUT/sweep-sp17.json \
  --variants ${W17}apxsk4,${W17}spxsk4,64x256x4x132xs3xkv1024xq2xkb128xbalxnfxrnxspxsk4,64x256x8x132xs3xkv1024xq2xkb128xnfxrnxspxsk4 2>&1 | grep -v Warn | tee $OUT/sweep-sp17.txt
python3 -m megakernel.bench.sweep --batch-sizes 24 --jobs 8 --json $OUT/sweep-sp24.json \
  --variants ${W24}apxsk4,${W24}spxsk4 2>&1 | grep -v Warn | tee $OUT/sweep-sp24.txt
timeout 150 python3 -m megakernel trace llama-3.2-1b --batch-size 17 --variant ${W17}spxsk4 -o /tmp/b17sp.png 2>&1 | grep -v Warn > $OUT/trace-b17-sp.txt; head -30 $OUT/trace-b17-sp.txt
timeout 200 python3 -m pytest -q -x tests/test_megakernel_gpu.py -k "17-sp" 2>&1 | tail -3 | tee $OUT/gpu-sp.txt
