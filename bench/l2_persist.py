"""Whether the weights the megakernel asks L2 for with evict_last priority (``el``) persist only
where part of L2 is set aside for persisting lines: each variant timed with no set-aside (the
driver's default) and with the largest the GPU allows, alternating, in one process.

    python -m megakernel.bench.l2_persist --winners autotune.json --batch-sizes 24,64 \\
        --flags pf128,pf256 --rounds 3

PTX ``evict_last`` is the persisting access property; persisting lines have first use of the
set-aside (``CU_LIMIT_PERSISTING_L2_CACHE_SIZE``, 0 unless a program sets it), and with none
set aside they may go as any other line. Per batch size: the ledger's winner and it with each
of ``--flags`` (more of each task's weights asked for, say), each variant's median ms over
the rounds at each set-aside, and its logits' distance from eager's. GPU only.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics

import torch

LIMIT_PERSISTING_L2 = 0x06               # CUlimit CU_LIMIT_PERSISTING_L2_CACHE_SIZE
ATTR_MAX_PERSISTING_L2 = 108             # CUdevice_attribute ..._MAX_PERSISTING_L2_CACHE_SIZE


def _driver():
    return ctypes.CDLL("libcuda.so.1")


def max_set_aside(device: int = 0) -> int:
    """The most bytes of L2 this GPU lets a context set aside for persisting lines."""
    value = ctypes.c_int()
    err = _driver().cuDeviceGetAttribute(ctypes.byref(value), ATTR_MAX_PERSISTING_L2, device)
    if err:
        raise RuntimeError(f"cuDeviceGetAttribute(max persisting L2) failed: CUresult {err}")
    return value.value


def set_aside(nbytes: int) -> int:
    """Set the current context's persisting set-aside to ``nbytes``; the size it reports back."""
    torch.cuda.synchronize()                 # the context current on this thread, work done
    drv, got = _driver(), ctypes.c_size_t()
    err = drv.cuCtxSetLimit(LIMIT_PERSISTING_L2, ctypes.c_size_t(nbytes))
    err = err or drv.cuCtxGetLimit(ctypes.byref(got), LIMIT_PERSISTING_L2)
    if err:
        raise RuntimeError(f"setting the persisting L2 set-aside failed: CUresult {err}")
    return got.value


def time_batch(model, batch: int, context: int, labels: list[str], sizes: list[int],
               rounds: int, iters: int) -> list[dict]:
    """Rows of one batch size: each (variant, set-aside) pair's median ms over the rounds."""
    from megakernel.bench.decode import decode_state, median_step_ms
    from megakernel.bench.sweep import parse_variant, rel_err
    from megakernel.runtime.megakernel import megakernel_backend

    tokens, positions, cache = decode_state(model, batch, context)
    with torch.inference_mode():
        expected = model(tokens, positions, cache)
        steps = {v: megakernel_backend(model, cache, **parse_variant(v)) for v in labels}
        errs = {v: rel_err(s(tokens, positions, cache), expected) for v, s in steps.items()}
        times = {(v, n): [] for v in labels for n in sizes}
        for _ in range(rounds):
            for n in sizes:
                set_aside(n)
                for v, s in steps.items():
                    times[v, n].append(median_step_ms(lambda: s(tokens, positions, cache),
                                                      cache.device, 5, iters))
        set_aside(0)
        for s in steps.values():
            s.synchronize()
    return [{"batch": batch, "variant": v, "set_aside": n, "ms": statistics.median(t),
             "ms_rounds": t, "rel_err": errs[v]} for (v, n), t in times.items()]


def main(argv: list[str] | None = None) -> int:
    from megakernel.bench.sweep import (build_all, collect_rows, round_args, rounds_text,
                                        winner_variants)
    from megakernel.models import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    round_args(p, winners_required=True)
    p.add_argument("--flags", default="", help="flags each also timed with, e.g. pf128,pf0")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("l2_persist needs a CUDA GPU: L2's set-aside is the driver's")
    model = load_model(args.model, device="cuda", dtype="bfloat16", progress=False).model
    batches = [int(b) for b in args.batch_sizes.split(",")]
    flags = [f for f in args.flags.split(",") if f]
    plan = {b: winner_variants(args.winners, b, flags) for b in batches}
    if args.jobs > 1:
        build_all(model, plan, args.context, args.jobs)
    sizes = [0, max_set_aside()]
    print(f"L2 set-aside for persisting lines: 0 and {sizes[1] / 2**20:.1f} MiB "
          f"(granted {set_aside(sizes[1]) / 2**20:.1f}); L2 "
          f"{torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MiB", flush=True)
    set_aside(0)
    collect_rows(batches, lambda b: time_batch(model, b, args.context, plan[b], sizes,
                                               args.rounds, args.iters),
                 lambda row: f"{args.model} B={row['batch']} {row['variant']:<60} set-aside "
                             f"{row['set_aside'] / 2**20:5.1f} MiB {row['ms']:7.3f} ms  "
                             f"rel err {row['rel_err']:.1e}  {rounds_text(row['ms_rounds'])}",
                 args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
