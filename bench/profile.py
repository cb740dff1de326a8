"""Where a backend's decode step spends its GPU time: the top kernels under torch.profiler.

    python -m megakernel.bench.profile --model llama-3.2-1b --batch-size 32 --backend torch-compile
"""
from __future__ import annotations

import argparse

import torch

from megakernel.models import load_model
from megakernel.bench.decode import decode_state
from megakernel.runtime import get_backend


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--backend", default="torch-compile")
    p.add_argument("--rows", type=int, default=15)
    args = p.parse_args(argv)
    model = load_model(args.model, device="cuda", dtype="bfloat16", progress=False).model
    tokens, positions, cache = decode_state(model, args.batch_size, args.context)
    step = get_backend(args.backend)(model, cache)
    with torch.inference_mode():
        for _ in range(5):
            step(tokens, positions, cache)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step(tokens, positions, cache)
            torch.cuda.synchronize()
    print(f"{args.model} B={args.batch_size} {args.backend}: per-step totals below are x10")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows,
                                    max_name_column_width=70))


if __name__ == "__main__":
    main()
