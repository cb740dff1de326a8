python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export MEGAKERNEL_CACHE=/tmp/mkcache PYTHONUNBUFFERED=1
tr() { # B VARIANT NAME
  timeout 170 python3 -m megakernel trace llama-3.2-1b --batch-size $1 --variant $2 -o /tmp/$3.png > $OUT/trace-$3.txt 2>&1
  echo "== $3 rc=$?"; head -40 $OUT/trace-$3.txt | grep -v Warn
}
tr 16 64x256x4x132xs3xkv1024xq2xkb128xnfxsk4 b16
tr 17 64x256x8x132xs3xkv1024xq2xkb128xbalxnfxrnxapxsk4 b17
tr 17 64x256x4x132xs3xkv1024xq2xkb128xnfxsk4 b17-w16
tr 1 64x256x4x132xs3xkv128xq2xkb128xbalxnf0xafxsk1 b1
