"""How fast one op body streams weights, alone: a persistent grid runs ``ops.matmul_tile``
(RMSNorm prologue off) over row blocks of one large [N, K] bf16 matrix, no waits between
programs, and reports TB/s beside ``torch.mv`` (``--batch`` rows: ``torch.mm``) on the same
matrix. Separates the body's bytes in flight from the megakernel's synchronisation.

    python -m megakernel.bench.stream --variants 64x256x4x1xs3,16x1024x4x1xs3xf16
    python -m megakernel.bench.stream --batch 64 --variants 64x256x4x1xs3,64x256x4x1xs3xt

Variant: BNxBKxWARPSxCTAS_PER_SMxsSTAGES, then flags: g GEMV form, fN N column slices folded into
the dot, p L2 prefetch of the next tile, n the RMSNorm prologue, t weight rows as the dot's M.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from megakernel.compiler import kernel_loop, ops
from megakernel.compiler.registry import p2


@triton.jit
def stream_kernel(x_ptr, w_ptr, y_ptr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, FORM: tl.constexpr, STAGES: tl.constexpr,
                  PREFETCH: tl.constexpr, NORM: tl.constexpr, BLOCK_B: tl.constexpr,
                  FOLD: tl.constexpr, B: tl.constexpr):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rstd = tl.zeros([BLOCK_B], tl.float32)
    tile = pid
    while tile < N // BLOCK_N:
        n0 = tile * BLOCK_N
        if PREFETCH:                                   # the next tile of this program
            nxt = tl.minimum(tile + grid, N // BLOCK_N - 1)
            kernel_loop.prefetch_l2(w_ptr + nxt.to(tl.int64) * BLOCK_N * K, BLOCK_N * K)
        if NORM:                                       # the RMSNorm prologue of a projection
            rstd = ops.row_rstd(x_ptr, 1e-5, B, K, BLOCK_B, K)
        acc = ops.matmul_tile(x_ptr, x_ptr, rstd, w_ptr, n0, BLOCK_N, 0, B, K, NORM, BLOCK_B,
                              BLOCK_N, BLOCK_N, BLOCK_K, tl.bfloat16, FORM, STAGES, FOLD)
        ops.store_rows(y_ptr, acc.to(tl.bfloat16), n0, N, B, N, BLOCK_B, BLOCK_N)
        tile += grid


def time_ms(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=65536)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--variants", default="64x256x4x1xs3")
    args = p.parse_args(argv)
    b = args.batch
    w = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(b, args.k, device="cuda", dtype=torch.bfloat16)  # [B, K]
    y = torch.empty(b, args.n, device="cuda", dtype=torch.bfloat16)  # [B, N]
    nbytes, sms = w.numel() * 2, torch.cuda.get_device_properties(0).multi_processor_count
    ms = time_ms(lambda: torch.mv(w, x[0]) if b == 1 else torch.mm(x, w.t()))
    name = "torch.mv" if b == 1 else f"torch.mm x[{b}]"
    print(f"{name} {args.n}x{args.k}: {ms * 1e3:7.1f} us {nbytes / ms / 1e9:5.2f} TB/s", flush=True)
    ref = x.float() @ w.float().t()  # [B, N]
    for text in args.variants.split(","):
        parts = text.split("x")
        bn, bk, warps, per_sm = (int(v) for v in parts[:4])
        flag = lambda c, default: next((int(f[1:]) for f in parts[4:] if f[0] == c), default)
        stages, fold, gemv = flag("s", 1), flag("f", 1), "g" in parts[4:]
        form = 1 if gemv else 2 if "t" in parts[4:] else 0
        rows = p2(b, 1 if gemv else 16 // fold)           # BLOCK_B, as the registry pads it
        run = lambda: stream_kernel[(sms * per_sm,)](
            x, w, y, args.n, args.k, bn, bk, form, stages, "p" in parts[4:],
            "n" in parts[4:], rows, fold, b, num_warps=warps)
        try:
            ms = time_ms(run)
        except Exception as err:  # a variant that does not build or launch: report, go on
            print(f"{text:<22} failed: {type(err).__name__}: {str(err)[:120]}", flush=True)
            continue
        err = ((y.float() - ref).norm() / ref.norm()).item()
        print(f"{text:<22} {ms * 1e3:7.1f} us {nbytes / ms / 1e9:5.2f} TB/s  rel err {err:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
