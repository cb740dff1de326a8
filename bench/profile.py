"""Where a backend's decode step spends its GPU time: the top kernels under torch.profiler, and
how much of each step the GPU runs nothing (between kernels: copies of inputs, launch gaps).

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
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, span = busy_us(spans), spans[-1][1] - spans[0][0]
    print(f"GPU busy {busy / 10:.1f} of {span / 10:.1f} us a step (first to last activity), "
          f"idle {(span - busy) / 10:.1f}")


def busy_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of sorted (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for lo, hi in spans:
        total += max(0.0, hi - max(lo, end))
        end = max(end, hi)
    return total


if __name__ == "__main__":
    main()
