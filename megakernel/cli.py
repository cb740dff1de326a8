"""The ``megakernel`` command: ``generate``, ``compile``, ``autotune``, ``trace`` and ``bench``."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from megakernel.interpreter import kernel_target

# steps ``autotune`` times a variant by default: under the interpreter each takes about a second
# (tiny-llama), and 20 made a CPU tune of two batch sizes take about 17 minutes
TIMED_STEPS = {"cuda": 20, "cpu": 3}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _add_model_args(p: argparse.ArgumentParser, positional: bool = False) -> None:
    """--model (or, with ``positional``, MODEL first as autotune and compile take it), device,
    dtype and seed."""
    if positional:
        p.add_argument("model_first", nargs="?", metavar="MODEL",
                       help="preset name or local Hugging Face folder (or --model)")
    p.add_argument("--model", required=not positional,
                   help="preset name or local Hugging Face folder")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--seed", type=int, default=0, help="seed of preset weights and of sampling")


def _resolve_device(args) -> tuple[str, str]:
    device = args.device or default_device()
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda was asked for, but no CUDA GPU is visible")
    return device, args.dtype or ("bfloat16" if device == "cuda" else "float32")


def cmd_generate(args) -> int:
    from megakernel.models import load_model
    from megakernel.runtime import Engine, SamplingParams

    device, dtype = _resolve_device(args)
    if args.kernels and args.backend != "megakernel":
        raise ValueError("--kernels needs --backend megakernel")
    if args.backend == "megakernel":
        kernel_target(device)
    loaded = load_model(args.model, device=device, dtype=dtype, seed=args.seed,
                        progress=not args.json)
    tok = loaded.tokenizer
    prompt_ids = [tok.encode(p) for p in args.prompt]
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, seed=args.seed)
    kernels = None
    if args.kernels:
        from megakernel.runtime.megakernel import KernelLibrary

        kernels = KernelLibrary(args.kernels, loaded.model)
    engine = Engine(loaded.model, backend=args.backend, max_seq_len=args.max_seq_len,
                    kernels=kernels)
    run = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, eos_ids=tok.eos_ids,
               pad_id=tok.pad_id, keep_logits=args.verify)
    result = engine.generate(prompt_ids, **run)
    compiled = getattr(engine.step_fn, "compiled", None)
    if compiled is not None and not args.json:
        from megakernel.compiler.report import summary

        print(summary(compiled))
    if result.padded_batch != len(prompt_ids) and not args.json:
        print(f"padded batch {len(prompt_ids)} to the compiled batch size {result.padded_batch}")
    if args.verify:
        reference = Engine(loaded.model, backend="eager", max_seq_len=args.max_seq_len)
        verify(result, reference.generate(prompt_ids, **run), dtype)
    texts = [tok.decode(ids) for ids in result.generated_ids]
    if args.json:
        print(json.dumps({"prompt_ids": result.prompt_ids, "generated_ids": result.generated_ids,
                          "text": texts}))
        return 0
    for prompt, text in zip(args.prompt, texts):
        print(f"{prompt!r} -> {text!r}")
    print(f"[{loaded.name} {args.backend} {device} {dtype}] prefill {result.prefill_s * 1e3:.1f} ms, "
          f"{result.decode_steps} decode steps, {result.decode_tokens_per_s:.1f} tokens/s")
    return 0


class DivergenceError(RuntimeError):
    pass


def verify(result, reference, dtype: str) -> None:
    """Same tokens as the eager engine, and logits within the dtype's tolerance at every step."""
    tol = 1e-4 if dtype == "float32" else 5e-2
    for step, (a, b) in enumerate(zip(result.step_logits, reference.step_logits)):
        err = ((a - b).norm() / b.norm()).item()
        if not err <= tol:
            raise DivergenceError(f"verify: step {step} logits differ from eager by {err:.2e} "
                                  f"(relative norm; tolerance {tol:.0e})")
    if result.generated_ids != reference.generated_ids:
        raise DivergenceError(f"verify: tokens differ from eager: {result.generated_ids} vs "
                              f"{reference.generated_ids}")
    print(f"verify: {len(result.step_logits)} steps agree with the eager engine", file=sys.stderr)


def cmd_compile(args) -> int:
    from pathlib import Path

    device, dtype = _resolve_device(args)
    target = kernel_target(device)
    from megakernel.compiler.artifact import cache_key, save
    from megakernel.compiler.pipeline import CompileOptions, compile_model
    from megakernel.compiler.report import summary
    from megakernel.models import ModelConfig, PRESETS, parse_dtype
    from megakernel.models.weights import empty_model

    cfg = PRESETS.get(args.model) or ModelConfig.from_folder(args.model)
    name = Path(args.model).name
    model = empty_model(cfg).to(parse_dtype(dtype))
    for batch in parse_batch_sizes(args.batch_sizes):
        opts = CompileOptions(batch, args.max_seq_len, target=target, scheduler=args.scheduler)
        compiled = compile_model(model, opts, name)
        folder = save(compiled, model, Path(args.output) / f"b{batch}", cache_key(model, opts))
        print(summary(compiled))
        print(f"  -> {folder}")
    return 0


def cmd_trace(args) -> int:
    from pathlib import Path

    device, dtype = _resolve_device(args)
    kernel_target(device)
    from megakernel.bench.decode import decode_state
    from megakernel.models import load_model
    from megakernel.runtime.megakernel import megakernel_backend
    from megakernel.runtime.trace import draw_timeline, print_tables, trace_step

    loaded = load_model(args.model, device=device, dtype=dtype, seed=args.seed, progress=False)
    tokens, positions, cache = decode_state(loaded.model, args.batch_size, args.context)
    options = {}
    if args.variant:
        from megakernel.compiler.cost import TARGETS
        from megakernel.runtime.variant import parse_variant

        options = parse_variant(args.variant).options(TARGETS[kernel_target(device)].sms)
    step = megakernel_backend(loaded.model, cache, trace=True, **options)
    with torch.inference_mode():
        for _ in range(args.steps):
            step(tokens, positions, cache)
    traces = trace_step(step)
    from megakernel.runtime.effective import variant_of

    print(f"kernel: {variant_of(step.compiled).label}"
          f"{'' if args.variant else ' (autotuned, or the default variant)'}")
    if args.json:
        import dataclasses
        import json

        tasks = step.compiled.tasks.tasks
        rows = [dict(dataclasses.asdict(t), op=tasks[t.task].op, args=tasks[t.task].args)
                for t in traces]
        Path(args.json).write_text(json.dumps(rows, default=str))
    per_us, unit = (1e3, "ns") if step.trace_mode == 2 else (1.0, "ticks (interpreter order)")
    measured = "us" if step.trace_mode == 2 else "ticks"
    print_tables(traces, step.compiled, per_us, measured)
    print(f"step: {max(t.end for t in traces) / per_us:.1f} {measured} on {len(step.queues)} "
          f"workers (predicted {step.compiled.schedule.makespan_us:.1f} us); "
          f"timeline -> {args.output}", flush=True)     # the tables first: drawing takes longest
    draw_timeline(traces, Path(args.output), f"{loaded.name} batch {args.batch_size}, "
                  f"context {args.context}, {device}", unit)
    return 0


def parse_batch_sizes(text: str) -> list[int]:
    """'1,4,8-10' -> [1, 4, 8, 9, 10]: sizes and ascending ranges of positive integers, each
    size once, in the order given."""
    sizes: dict[int, None] = {}
    for part in str(text).split(","):
        lo, dash, hi = part.strip().partition("-")
        hi = hi if dash else lo
        if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
            raise ValueError(f"batch sizes {text!r}: {part.strip()!r} is not a positive integer "
                             "or an ascending range of them (e.g. 1,4,8-10)")
        sizes.update(dict.fromkeys(range(int(lo), int(hi) + 1)))
    return list(sizes)


def cmd_autotune(args) -> int:
    from pathlib import Path

    device, dtype = _resolve_device(args)
    kernel_target(device)
    from rich.console import Console
    from rich.table import Table

    from megakernel.models import load_model
    from megakernel.runtime.autotune import REFINE, autotune
    from megakernel.runtime.megakernel import cache_dir

    loaded = load_model(args.model, device=device, dtype=dtype, seed=args.seed, progress=False)
    folder = Path(args.output or cache_dir() / "autotune" / loaded.name)
    if device == "cpu":
        print("autotuning under the Triton interpreter: its timings rank variants by CPU time, "
              "not by how fast they run on a GPU", file=sys.stderr)
    iters = args.iters if args.iters is not None else TIMED_STEPS[device]
    winners = autotune(loaded.model, loaded.name, parse_batch_sizes(args.batch_sizes),
                       args.max_seq_len, folder, classes=args.classes, iters=iters,
                       processes=args.jobs, max_rel_err=args.max_rel_err,
                       refine=() if args.no_refine else REFINE, finalists=args.finalists,
                       prior=args.prior)
    table = Table(title=f"{loaded.name} on {device}, context {args.max_seq_len}: {folder}")
    for col in ("batch", "winner", "ms/token", "predicted us", "timed", "failed"):
        table.add_column(col, justify="left" if col == "winner" else "right",
                         overflow="fold" if col == "winner" else "ellipsis")
    for w in winners:
        table.add_row(str(w.batch), w.label, f"{w.ms:.3f}", f"{w.predicted_us:.0f}", str(w.timed),
                      str(w.failed))
    Console().print(table)
    return 0


def cmd_bench_decode(args) -> int:
    from megakernel.bench.decode import run_decode_bench

    run_decode_bench(args)
    return 0


def _add_generate(sub) -> None:
    """``megakernel generate``."""
    gen = sub.add_parser("generate", help="generate text from one or more prompts")
    _add_model_args(gen)
    gen.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--max-seq-len", type=int, default=None)
    gen.add_argument("--backend", default="eager",
                     help="eager | torch-compile | megakernel | megakernel-cuda (GPU: the "
                          "megakernel's tables run by the CUDA C++ kernel)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--kernels", default=None,
                     help="folder from `megakernel compile -o`; batches pad to a compiled size")
    gen.add_argument("--verify", action="store_true",
                     help="run the eager engine alongside; exit non-zero on divergence")
    gen.set_defaults(func=cmd_generate)


def _add_autotune(sub) -> None:
    """``megakernel autotune``."""
    from megakernel.runtime.finals import FINALISTS

    tune = sub.add_parser("autotune",
                          help="search, time and keep the fastest kernel per batch size")
    tune.add_argument("model", help="preset name or local Hugging Face folder")
    tune.add_argument("--batch-sizes", default="1", help="e.g. 1-64 or 1,2,3,5,8")
    tune.add_argument("--max-seq-len", type=int, default=1024, help="also the timed context")
    tune.add_argument("--classes", type=int, default=2,
                      help="best schedules (by the cost model) whose kernel knobs are all timed")
    tune.add_argument("--iters", type=int, default=None,
                      help="timed steps per variant (default 20 on a GPU, 3 on the CPU, where "
                           "each is a run of the Triton interpreter)")
    tune.add_argument("--no-refine", action="store_true",
                      help="do not time each batch size's fastest again with balanced "
                           "projection spans, the other cache block, deeper pipelines and "
                           "steps, and K slices on or off")
    tune.add_argument("--finalists", type=int, default=FINALISTS,
                      help="each batch size's fastest variants timed again side by side in "
                           "interleaved rounds, the winner the fastest there (below 2: none)")
    tune.add_argument("--max-rel-err", type=float, default=0.1,
                      help="a variant whose logits differ more from eager's (relative norm) is "
                           "recorded as wrong and never kept (a bf16 step differs by ~3e-2)")
    tune.add_argument("--prior", default=None, metavar="LEDGER",
                      help="an earlier autotune.json: the winners of its final rounds (same "
                           "model and context) are timed beside each batch size's shortlist")
    tune.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                      help="variants compiled and built at once, one process each")
    tune.add_argument("--device", choices=["cpu", "cuda"], default=None)
    tune.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None)
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("-o", "--output", help="default: $MEGAKERNEL_CACHE/autotune/MODEL")
    tune.set_defaults(func=cmd_autotune)


def _add_compile(sub) -> None:
    """``megakernel compile``."""
    comp = sub.add_parser("compile", help="compile a megakernel per batch size into a folder")
    comp.add_argument("model", help="preset name or local Hugging Face folder")
    comp.add_argument("--batch-sizes", default="1")
    comp.add_argument("--max-seq-len", type=int, default=1024)
    comp.add_argument("--device", choices=["cpu", "cuda"], default=None)
    comp.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None)
    comp.add_argument("--scheduler", default="cpsat",
                      help="cpsat (rates greedy and CP-SAT, keeps the better) | greedy")
    comp.add_argument("-o", "--output", required=True)
    comp.set_defaults(func=cmd_compile)


def _add_trace(sub) -> None:
    """``megakernel trace``."""
    tr = sub.add_parser("trace", help="per-task stamps from inside the kernel, drawn as a timeline")
    _add_model_args(tr, positional=True)
    tr.add_argument("--batch-size", type=int, default=1)
    tr.add_argument("--context", type=int, default=1024)
    tr.add_argument("--steps", type=int, default=3, help="steps run; the last is drawn")
    tr.add_argument("-o", "--output", required=True, help="PNG file")
    tr.add_argument("--json", help="also write every task's stamps to this file")
    tr.add_argument("--variant", help="variant label (runtime/variant.py), e.g. 64x256x4x132xs3")
    tr.set_defaults(func=cmd_trace)


def _add_bench(sub) -> None:
    """``megakernel bench`` and its subcommands."""
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    dec = bench_sub.add_parser("decode", help="per-token decode latency of each backend")
    _add_model_args(dec)
    dec.add_argument("--batch-sizes", default="1,8,32")
    dec.add_argument("--context", type=int, default=1024, help="tokens already in the cache")
    dec.add_argument("--backends", default="eager,torch-compile")
    dec.add_argument("--warmup", type=int, default=10)
    dec.add_argument("--iters", type=int, default=50)
    dec.add_argument("--json", dest="json_out", default=None, help="write results to this file")
    dec.add_argument("--plot", default=None, help="write a PNG of ms/token per batch size")
    dec.add_argument("--kernels", default=None,
                     help="time the megakernel of each batch size in this folder (from "
                          "`megakernel compile` or `megakernel autotune`)")
    dec.set_defaults(func=cmd_bench_decode)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megakernel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_generate, _add_autotune, _add_compile, _add_trace, _add_bench):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "model_first"):
        first = args.model_first
        if first and args.model and first != args.model:
            parser.error(f"two models named: {first} and --model {args.model}")
        args.model = args.model or first
        if not args.model:
            parser.error(f"{args.command}: a model is required (MODEL or --model)")
    try:
        return args.func(args)
    except DivergenceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
