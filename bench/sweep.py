"""Time megakernel variants (tile sizes, warps, workers) side by side with torch.compile.

    python -m megakernel.bench.sweep --model llama-3.2-1b --batch-size 1 \\
        --variants 64x64x4x132,32x512x4x132xgxs3  # block_n x block_k x warps x workers [x flags]
Prints one row per variant (ms/token, TB/s, ratio to torch-compile) and writes --json FILE.
"""
from __future__ import annotations

import argparse
import json

import torch

from megakernel.bench.decode import decode_state, median_step_ms, step_bytes
from megakernel.compiler.cost import H200
from megakernel.models import load_model
from megakernel.runtime import get_backend
from megakernel.runtime import variant
from megakernel.runtime.megakernel import megakernel_backend


def parse_variant(text: str) -> dict:
    """Compile options of a variant label (see ``megakernel.runtime.variant``)."""
    return variant.parse_variant(text).options(H200.sms)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--variants", default="64x64x4x132")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    model = load_model(args.model, device="cuda", dtype="bfloat16", progress=False).model
    b, ctx = args.batch_size, args.context
    tokens, positions, cache = decode_state(model, b, ctx)
    nbytes = step_bytes(model, b, ctx)
    rows = []
    ref = get_backend("torch-compile")(model, cache)
    with torch.inference_mode():
        base = median_step_ms(lambda: ref(tokens, positions, cache), cache.device, 10, args.iters)
        for text in args.variants.split(","):
            try:
                step = megakernel_backend(model, cache, **parse_variant(text))
                ms = median_step_ms(lambda: step(tokens, positions, cache), cache.device, 5,
                                    args.iters)
                step.synchronize()
            except (RuntimeError, ValueError) as err:  # does not fit, or a watchdog: go on
                print(f"{args.model} B={b} {text:<18} failed: {str(err)[:200]}", flush=True)
                rows.append({"variant": text, "error": str(err)[:300]})
                continue
            rows.append({"variant": text, "ms_per_token": ms, "TBps": nbytes / ms / 1e9,
                         "torch_compile_ms": base, "speedup": base / ms})
            print(f"{args.model} B={b} {text:<18} {ms:7.3f} ms  {nbytes / ms / 1e9:5.2f} TB/s  "
                  f"x{base / ms:.2f} vs torch-compile {base:.3f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
