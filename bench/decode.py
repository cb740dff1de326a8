"""Per-token decode latency of every backend, side by side in one process.

For each batch size, one KV cache holding ``context`` tokens per row is shared by all backends;
each backend decodes the next token (position ``context - 1``) ``warmup + iters`` times and the
median gap between consecutive steps (CUDA events on the GPU) is its ms/token. Reported with it:
the bytes one step must move (weights once, the KV cache read, the new KV written) and the achieved
bandwidth, against a device-to-device copy measured in the same run.
"""
from __future__ import annotations

import datetime
import statistics
import time
from pathlib import Path

import torch

from megakernel.models import CausalLM, load_model
from megakernel.runtime import allocate_kv_cache, cache_bytes, get_backend

from .results import check_plot_path, merge_results, plot_results


class Timer:
    """Stamps a sequence of points; CUDA events on the GPU, the host clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stamps: list = []

    def stamp(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.stamps.append(ev)
        else:
            self.stamps.append(time.perf_counter())

    def gaps_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.stamps, self.stamps[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.stamps, self.stamps[1:])]


def _stamped(fn, device: torch.device, warmup: int, iters: int, each: bool) -> Timer:
    """``warmup`` calls of ``fn``, then ``iters`` stamped ones: a stamp before the first and
    after each of them (``each``) or after the last only."""
    for _ in range(warmup):
        fn()
    timer = Timer(device)
    timer.stamp()
    for i in range(iters):
        fn()
        if each or i == iters - 1:
            timer.stamp()
    return timer


def median_step_ms(fn, device: torch.device, warmup: int, iters: int) -> float:
    return statistics.median(_stamped(fn, device, warmup, iters, each=True).gaps_ms())


def mean_step_ms(fn, device: torch.device, warmup: int, iters: int) -> float:
    """``median_step_ms``'s figure from one span: ``iters`` steps back to back with nothing
    recorded between them (a step launched as a programmatic dependent launch may then start
    before the previous one ends), their total over ``iters``."""
    return _stamped(fn, device, warmup, iters, each=False).gaps_ms()[0] / iters


def copy_bandwidth_TBps(device: torch.device) -> float:
    nbytes = 1 << 31 if device.type == "cuda" else 1 << 26
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = median_step_ms(lambda: dst.copy_(src), device, warmup=5, iters=20)
    return 2 * nbytes / (ms * 1e-3) / 1e12


def weight_bytes_per_step(model: CausalLM, batch: int) -> int:
    """Every matrix once; of an untied embedding table only the B looked-up rows."""
    params = {id(p): p for p in model.parameters()}
    total = sum(p.numel() * p.element_size() for p in params.values())
    if not model.config.tie_word_embeddings:
        emb = model.embed_tokens.weight
        total -= emb.numel() * emb.element_size() - batch * emb.shape[1] * emb.element_size()
    return total


def step_bytes(model: CausalLM, batch: int, context: int) -> int:
    itemsize = next(model.parameters()).element_size()
    cfg = model.config
    return (weight_bytes_per_step(model, batch) + cache_bytes(cfg, batch, context, itemsize)
            + cache_bytes(cfg, batch, 1, itemsize))


def decode_state(model: CausalLM, batch: int, context: int):
    """Inputs of one decode step at position ``context - 1``: seeded random tokens [B, 1],
    positions [B, 1] and a cache [L, 2, B, Hkv, context, D] of random values (never zeros)."""
    cfg, p = model.config, next(model.parameters())
    cache = allocate_kv_cache(cfg, batch, context, dtype=p.dtype, device=p.device)
    cache.normal_(std=0.5)
    gen = torch.Generator(device=p.device).manual_seed(batch)
    tokens = torch.randint(0, cfg.vocab_size, (batch, 1), device=p.device, generator=gen)
    positions = torch.full((batch, 1), context - 1, device=p.device)
    return tokens, positions, cache


MEGAKERNELS = ("megakernel", "megakernel-cuda")


def megakernel_step(model: CausalLM, cache, kernels: str | None, name: str = "megakernel"):
    """The default kernel for the cache, or with ``kernels`` the one compiled (or autotuned)
    for exactly this batch size in that folder; ``megakernel-cuda``: its variant in the form
    the CUDA backend builds, run by that backend."""
    from megakernel.runtime.megakernel import KernelLibrary

    if kernels is None:
        return get_backend(name)(model, cache)
    library, batch = KernelLibrary(kernels, model), cache.shape[2]
    if batch not in library.batch_sizes:
        raise ValueError(f"no kernel for batch {batch} in {kernels} (has {library.batch_sizes})")
    compiled = library.pick(batch, cache.shape[4])
    if name == "megakernel":
        return library.step(compiled, model, cache)
    from megakernel.runtime.cuda_step import CudaStep, cuda_compiled

    return CudaStep(cuda_compiled(compiled, model, cache.device), model, cache)


def bench_batch(model: CausalLM, backends: list[str], batch: int, context: int,
                warmup: int, iters: int, kernels: str | None = None) -> dict[str, tuple]:
    """backend -> (ms per token, variant label of the megakernel or None)."""
    from megakernel.runtime.effective import variant_of

    tokens, positions, cache = decode_state(model, batch, context)
    p = next(model.parameters())
    times = {}
    for name in backends:
        step = (megakernel_step(model, cache, kernels, name) if name in MEGAKERNELS
                else get_backend(name)(model, cache))
        label = variant_of(step.compiled).label if name in MEGAKERNELS else None
        with torch.inference_mode():
            times[name] = (median_step_ms(lambda: step(tokens, positions, cache), p.device,
                                          warmup, iters), label)
            getattr(step, "synchronize", lambda: None)()    # a megakernel reports late errors
    return times


def timing_order(batch_sizes: list[int], backends: list[str]) -> list[tuple[int, list[str]]]:
    """(batch size, backends) in the order they are timed: eager after every other backend of
    every batch size, because eager steps earlier in a process slowed torch-compile's later
    ones (llama-3.2-1b at batch 1 on the H200: 1.35 ms in both processes that ran eager first,
    1.26 in three that did not; bench/NOTES.md)."""
    first = [b for b in backends if b != "eager"]
    order = [(batch, first) for batch in batch_sizes if first]
    return order + [(batch, ["eager"]) for batch in batch_sizes if "eager" in backends]


def environment(device: torch.device) -> dict:
    import triton

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"gpu": gpu, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "triton": triton.__version__}


def run_decode_bench(args) -> dict:
    from megakernel.cli import _resolve_device, parse_batch_sizes

    device_name, dtype = _resolve_device(args)
    device = torch.device(device_name)
    loaded = load_model(args.model, device=device, dtype=dtype, seed=args.seed)
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    backends = [b for b in args.backends.split(",") if b]
    for name in backends:
        get_backend(name)  # fail before any timing on an unknown name
    if args.plot:
        check_plot_path(Path(args.plot))
    report = environment(device) | {"copy_TBps": round(copy_bandwidth_TBps(device), 4)}
    rows = []
    for batch, group in timing_order(batch_sizes, backends):
        nbytes = step_bytes(loaded.model, batch, args.context)
        for name, (ms, label) in bench_batch(loaded.model, group, batch, args.context,
                                             args.warmup, args.iters, args.kernels).items():
            rows.append({"model": loaded.name, "batch_size": batch, "context": args.context,
                         "backend": name, "dtype": dtype, "ms_per_token": round(ms, 4),
                         "bytes_per_step": nbytes,
                         "achieved_TBps": round(nbytes / (ms * 1e-3) / 1e12, 6)}
                        | ({"variant": label} if label else {}))
            print(f"{loaded.name} B={batch:<3} ctx={args.context} {name:<14} {ms:8.3f} ms/token "
                  f"{rows[-1]['achieved_TBps']:.2f} TB/s (copy {report['copy_TBps']:.2f})",
                  flush=True)
        if args.json_out:  # after each batch size: a run cut short keeps what it timed
            merge_results(Path(args.json_out), report | {"results": rows})
    report["results"] = rows
    if args.json_out:
        report = merge_results(Path(args.json_out), report)
    if args.plot:
        plot_results(report, Path(args.plot))
    return report
