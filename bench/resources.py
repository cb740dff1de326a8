"""Registers, shared memory and spills of megakernel variants, built for Hopper without a GPU.

    python -m megakernel.bench.resources --model llama-3.2-1b --batch-size 1 \
        --variants 64x256x4x132xs3,32x256x4x264xs2

Each variant is compiled and built for sm_90 (``compiler.hopper``); the cubin's resource usage
(``cuobjdump --dump-resource-usage``) and Triton's shared memory give how many programs fit per
SM, so variants that cannot be resident are known before a GPU is touched.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import torch


def cubin_usage(cubin: bytes) -> dict:
    import triton

    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], check=True,
                              capture_output=True, text=True).stdout
    field = lambda name: int(m.group(1)) if (m := re.search(name + r"[:=]\s*(\d+)", text)) else 0
    return {"regs": field("REG"), "stack": field("STACK")}


def main(argv: list[str] | None = None) -> None:
    from megakernel.compiler.cost import TARGETS
    from megakernel.compiler.hopper import compile_for_hopper
    from megakernel.compiler.pipeline import CompileOptions, compile_model
    from megakernel.models import PRESETS
    from megakernel.models.weights import empty_model
    from megakernel.runtime.megakernel import load_kernel, programs_per_sm
    from megakernel.runtime.variant import parse_variant

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--variants", required=True)
    args = p.parse_args(argv)
    model, sms = empty_model(PRESETS[args.model]).to(torch.bfloat16), TARGETS["h200"].sms
    for text in args.variants.split(","):
        v = parse_variant(text)
        opts = CompileOptions(args.batch_size, args.max_seq_len, target="h200",
                              **v.options(sms))
        c = compile_model(model, opts, args.model)
        kernel = load_kernel(c.kernel.source, c.kernel.kernel_name)
        built = compile_for_hopper(kernel, num_warps=v.num_warps, switches=opts.switches(),
                                   max_registers=opts.max_registers)
        use = cubin_usage(built.asm["cubin"])
        fit = programs_per_sm(use["regs"], built.metadata.shared, v.num_warps)
        print(f"{text:<28} regs {use['regs']:3d}  stack {use['stack']:4d}  smem "
              f"{built.metadata.shared:6d}  programs/SM {fit}  needs {-(-v.workers // sms)}",
              flush=True)


if __name__ == "__main__":
    main()
