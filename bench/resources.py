"""Registers, shared memory and spills of megakernel variants, built for Hopper without a GPU.

    python -m megakernel.bench.resources --model llama-3.2-1b --batch-size 1 \
        --variants 64x256x4x132xs3,32x256x4x264xs2 [--loops 4]

Each variant is compiled and built for sm_90 (``compiler.hopper``); the cubin's resource usage
(``cuobjdump --dump-resource-usage``) and Triton's shared memory give how many programs fit per
SM, so variants that cannot be resident are known before a GPU is touched. With ``--loops N``
the N longest loops of the SASS (``cuobjdump -sass``; a loop: a backward branch's span) are
listed with their instructions a trip, the copies, MMAs, barriers and global loads among them,
and the spill traffic (local loads and stores) that runs in them.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import torch


def cuobjdump(cubin: bytes, flag: str) -> str:
    """``cuobjdump FLAG`` of a cubin (Triton's own copy of the tool)."""
    import triton

    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), flag, f.name], check=True, capture_output=True,
                              text=True).stdout


def cubin_usage(cubin: bytes) -> dict:
    text = cuobjdump(cubin, "--dump-resource-usage")
    field = lambda name: int(m.group(1)) if (m := re.search(name + r"[:=]\s*(\d+)", text)) else 0
    return {"regs": field("REG"), "stack": field("STACK")}


# opcode families counted in a loop (the opcode before its first ".")
LOOP_OPS = {"copies": ("LDGSTS", "UTMALDG", "UBLKCP"), "mma": ("HMMA", "HGMMA"),
            "barriers": ("BAR",), "global loads": ("LDG",), "spills": ("LDL", "STL")}


def sass_loops(sass: str, longest: int = 4) -> list[dict]:
    """The ``longest`` loops of a SASS listing, longest first: each backward branch (to an
    address before it) spans a loop from its target to itself; per loop its first and last
    address, instructions a trip (the span's, branches included; inner loops counted once) and
    the counts of ``LOOP_OPS`` among them."""
    code = [(int(a, 16), text.strip()) for a, text in
            re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    index = {a: i for i, (a, _) in enumerate(code)}
    loops = {}
    for i, (a, text) in enumerate(code):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if m and (t := int(m.group(1), 16)) < a and t in index:
            loops[(index[t], i)] = None
    out = []
    for lo, hi in sorted(loops, key=lambda k: k[0] - k[1])[:longest]:
        ops = [re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
               for _, text in code[lo:hi + 1]]
        out.append({"from": hex(code[lo][0]), "to": hex(code[hi][0]), "instructions": len(ops)}
                   | {k: sum(op in names for op in ops) for k, names in LOOP_OPS.items()})
    return out


def main(argv: list[str] | None = None) -> None:
    from megakernel.compiler.cost import TARGETS
    from megakernel.compiler.hopper import compile_for_hopper
    from megakernel.compiler.pipeline import CompileOptions, compile_model
    from megakernel.models import PRESETS
    from megakernel.models.weights import empty_model
    from megakernel.runtime.megakernel import load_kernel
    from megakernel.runtime.residency import programs_per_sm
    from megakernel.runtime.variant import parse_variant

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--variants", required=True)
    p.add_argument("--loops", type=int, default=0,
                   help="also list the SASS's N longest loops (instructions a trip, spills)")
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
        for loop in sass_loops(cuobjdump(built.asm["cubin"], "-sass"), args.loops) \
                if args.loops else []:
            print("    loop " + "  ".join(f"{k} {v}" for k, v in loop.items()), flush=True)


if __name__ == "__main__":
    main()
