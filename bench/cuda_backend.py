"""The CUDA backend beside the Triton kernel of the same compiled tables, in one process.

    python -m megakernel.bench.cuda_backend --model llama-3.2-1b --batch-sizes 1 \
        --variant 64x256x4x132xs3xkv128xq2xkb128xnfxnsxsk1xni [--iters 200] [--trace DIR] \
        [--flights 2,4] [--lanes 0,1] [--kv-rings 0,1] [--kv-l2s 0,1] [--acquires none,both] \
        [--mma-chunks 1,4] [--mma-pages 16,32] [--kv-aheads 0,2] [--attn-runs 1,2] \
        [--attn-mmas 0,1] [--x-depths 8,16] [--probes 1,2,3] [--chunk-log 4096]

For each batch size: one decode step's logits of the Triton kernel and of a CUDA kernel for each
combination of the backend's knobs (ring copies in flight, attention a key a lane, its keys
and values through the ring or prefetched into L2 (and how far ahead), which of the waits and
the combine's ticket acquire, tensor-core pages' size and chunks, x's stages) against eager's
(relative norm of the difference, top-1 agreement), then their median step times, measured in
alternating rounds (GPU only).
``--trace DIR``: the trace tables and timeline of the first CUDA kernel (as ``megakernel trace``
prints and draws them), and with ``--probes`` those of the same kernel with each task's end
stamped at that mark of its body instead (``MK_PROBE``: 1 a projection's first page reduced
(tensor cores: its first page and x's first chunk landed), 2 all its pages reduced, 3 the body
done, 4 every warp's body done: the signal's release is what follows; 5, timing only, its
results wrong: as 2 with the tensor-core products left out), where a task's time goes.
"""
from __future__ import annotations

import argparse
import statistics

import torch


def _flag(a: str) -> bool:
    return bool(int(a))


def _or_auto(parse):
    return lambda a: None if a == "auto" else parse(a)


# CudaStep knob: its flag (comma-separated values, a CUDA kernel for every combination), the
# default values, how one value is read, help
KNOBS = {
    "flight": ("--flights", "auto", _or_auto(int),
               "CUDA kernels with at most these many ring copies in flight (auto: "
               "generate_cuda's choice)"),
    "lanes": ("--lanes", "1", _flag,
              "CUDA kernels with attention a key a lane (1) or a key a warp (0)"),
    "kv_ring": ("--kv-rings", "0", _flag,
                "CUDA kernels with attention's keys and values through the ring (1)"),
    "kv_l2": ("--kv-l2s", "1", _flag,
              "CUDA kernels with attention's keys and values prefetched into L2 by the "
              "producer (1)"),
    "acquire": ("--acquires", "none", str,
                "CUDA kernels whose waits' polls and/or fused combine's ticket are acquire "
                "operations (none, polls, ticket, both)"),
    "mma_chunks": ("--mma-chunks", "4", int,
                   "tensor cores: 64-column chunks of a narrow task a ring page holds"),
    "mma_page_kib": ("--mma-pages", "16", int, "tensor cores: KiB a ring page, at least"),
    "kv_ahead": ("--kv-aheads", "0", int,
                 "attention's L2 prefetches held until the consumers are at most this many "
                 "tasks behind (0: never)"),
    "attn_runs": ("--attn-runs", "1", int,
                  "runs of keys each attention warp keeps in flight (a key a lane)"),
    "attn_mma": ("--attn-mmas", "auto", _or_auto(_flag),
                 "attention through the ring on tensor cores (0, 1, auto: with the "
                 "projections)"),
    "x_depth": ("--x-depths", "0", int,
                "tensor-core projections' stages of x's chunks (0: the backend's choice)"),
}


def top1(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.float().argmax(-1) == ref.float().argmax(-1)).float().mean().item()


def compare(model, variant: str, batch: int, context: int, iters: int, rounds: int,
            trace: str | None, grid: dict[str, list], probes: list[int],
            chunk_log: int = 0) -> dict:
    """``grid``: each CudaStep knob's values; a CUDA kernel for every combination."""
    import itertools

    from megakernel.bench.decode import median_step_ms
    from megakernel.bench.sweep import rel_err
    from megakernel.compiler.artifact import compile_cached
    from megakernel.compiler.pipeline import CompileOptions
    from megakernel.runtime.cuda_step import CudaStep
    from megakernel.runtime.measure import step_inputs
    from megakernel.runtime.megakernel import MegakernelStep, cache_dir
    from megakernel.runtime.variant import parse_variant

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    opts = CompileOptions(batch, context, **parse_variant(variant).options(sms))
    compiled, _ = compile_cached(model, opts, model.config.arch, cache_dir() / "artifacts")
    (tokens, positions, cache), expected = step_inputs(model, batch, context)
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    steps = {"triton": MegakernelStep(compiled, model, cache),
             **{"_".join(["cuda"] + [f"{k}{_short(v)}" for k, v in knobs.items()
                                     if len(grid[k]) > 1]): CudaStep(
                 compiled, model, cache, **knobs) for knobs in combos}}
    row = {"batch": batch, "variant": variant}
    with torch.inference_mode():
        for name, step in steps.items():
            out = step(tokens, positions, cache).float().view(batch, -1)
            step.synchronize()
            row[f"{name}_rel_err"] = rel_err(out, expected.view(batch, -1))
            row[f"{name}_top1"] = top1(out, expected.view(batch, -1))
        times = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                times[name].append(median_step_ms(lambda: step(tokens, positions, cache),
                                                  cache.device, 3, iters))
        for name, step in steps.items():
            step.synchronize()
            row[f"{name}_ms"] = statistics.median(times[name])
    if trace and chunk_log:
        waits(compiled, model, cache, (tokens, positions), combos[0] | {"chunk_log": chunk_log})
    for probe in [0, *probes] if trace else []:
        print(f"trace, end stamps at mark {probe}" if probe else "trace", flush=True)
        draw(compiled, model, cache, (tokens, positions), trace, batch,
             combos[0] | {"probe": probe})
    return row


def _short(value) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def waits(compiled, model, cache, inputs, knobs: dict) -> None:
    """The wait logs of a traced launch (``chunk_log``): medians by kind, then one task of
    each kind chunk by chunk (worker 5's first, warp 0 and the producer), ns."""
    from megakernel.runtime.cuda_step import CudaStep
    from megakernel.runtime.trace import chunk_lines, chunk_log, chunk_table

    step = CudaStep(compiled, model, cache, trace=True, **knobs)
    with torch.inference_mode():
        for _ in range(3):
            step(*inputs, cache)
    log = chunk_log(step)
    print("wait log (ns, medians)", flush=True)
    print("\n".join(chunk_lines(chunk_table(log))))
    first = {}
    for rec in log:
        if rec["worker"] == 5 and rec["stream"] != 1 and \
                first.setdefault((rec["stream"], rec["kind"]), rec["task"]) == rec["task"]:
            print(" ".join(f"{k}={v}" for k, v in rec.items() if k != "worker"))


def draw(compiled, model, cache, inputs, folder: str, batch: int, knobs: dict) -> None:
    """The CUDA kernel's trace tables (as ``megakernel trace`` prints them) and timeline."""
    from pathlib import Path

    from megakernel.runtime.trace import print_tables
    from megakernel.runtime.cuda_step import CudaStep
    from megakernel.runtime.trace import draw_timeline, trace_step

    step = CudaStep(compiled, model, cache, trace=True, **knobs)
    with torch.inference_mode():
        for _ in range(3):
            step(*inputs, cache)
    traces = trace_step(step)
    print_tables(traces, compiled, 1e3, "us")
    print(f"step: {max(t.end for t in traces) / 1e3:.1f} us", flush=True)
    Path(folder).mkdir(parents=True, exist_ok=True)
    probe = knobs.get("probe", 0)
    draw_timeline(traces, Path(folder) / f"timeline-cuda-b{batch}{f'-probe{probe}' * bool(probe)}"
                  ".png", f"CUDA backend, batch {batch}", "ns")


def main(argv: list[str] | None = None) -> int:
    from megakernel.cli import parse_batch_sizes
    from megakernel.models import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batch-sizes", default="1", help="sizes and ranges: 1,2,8-10")
    ap.add_argument("--variant", required=True)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trace", default=None, help="folder for the (first) CUDA kernel's timeline")
    ap.add_argument("--probes", default="",
                    help="with --trace: also trace with end stamps at these marks (1-5)")
    ap.add_argument("--chunk-log", type=int, default=0,
                    help="with --trace: also log this many tensor-core chunks and ring pages "
                         "a worker (their waits)")
    for flag, default, _, text in KNOBS.values():
        ap.add_argument(flag, default=default, help=text)
    args = ap.parse_args(argv)
    grid = {knob: [parse(a) for a in getattr(args, flag[2:].replace("-", "_")).split(",")]
            for knob, (flag, _, parse, _) in KNOBS.items()}
    model = load_model(args.model, device="cuda", dtype="bfloat16", progress=False).model
    for batch in parse_batch_sizes(args.batch_sizes):
        row = compare(model, args.variant, batch, args.context, args.iters, args.rounds,
                      args.trace, grid, [int(p) for p in args.probes.split(",") if p],
                      args.chunk_log)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
