"""Time megakernel variants (tile sizes, warps, workers, flags) side by side with torch.compile,
and check each against the eager model on the same step.

    python -m megakernel.bench.sweep --model llama-3.2-1b --batch-sizes 1,17 \\
        --variants 64x256x4x132xs3,64x256x4x132xs3xpl   # see megakernel.runtime.variant

Per batch size, one decode state (position context - 1): the baseline's median step, then per
variant its median step and the relative norm of its logits' difference from eager's on that
step (a variant beyond ``--max-rel-err`` is reported as wrong; a bf16 step differs by ~1e-2).
Prints one row per variant and writes them to --json FILE as each batch size ends. With
``--winners autotune.json`` the variants of each batch size are that ledger's fastest right one
and it with each of ``--flags`` added (e.g. ``--flags ar16,af``): a knob tried on every batch
size's own winner.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from megakernel.bench.decode import decode_state, mean_step_ms, median_step_ms, step_bytes
from megakernel.compiler.cost import H200
from megakernel.models import load_model
from megakernel.runtime import get_backend
from megakernel.runtime import variant
from megakernel.runtime.ledger import Ledger
from megakernel.runtime.megakernel import megakernel_backend


def parse_variant(text: str) -> dict:
    """Compile options of a variant label (see ``megakernel.runtime.variant``)."""
    return variant.parse_variant(text).options(H200.sms)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm()).item()


TIMINGS = {"median": median_step_ms, "mean": mean_step_ms}


def sweep_batch(model, batch: int, context: int, variants: list[str], baseline: str,
                iters: int, timing: str = "median") -> list[dict]:
    """Rows of one batch size: each variant's ms/token, TB/s, ratio to the baseline, and its
    logits' distance from eager's on the same step (or the error that stopped it). ``timing``:
    the median gap between steps, or the mean of steps launched back to back (``TIMINGS``)."""
    tokens, positions, cache = decode_state(model, batch, context)
    nbytes, dev = step_bytes(model, batch, context), cache.device
    ref_step = get_backend(baseline)(model, cache)
    step_ms = TIMINGS[timing]
    base = step_ms(lambda: ref_step(tokens, positions, cache), dev, 10, iters)
    rows = []
    for text in variants:
        row = {"batch": batch, "variant": text, "baseline": baseline, "baseline_ms": base,
               "timing": timing}
        try:
            step = megakernel_backend(model, cache, **parse_variant(text))
            ms = step_ms(lambda: step(tokens, positions, cache), dev, 5, iters)
            expected = model(tokens, positions, cache)    # same step, same cache slot written
            err = rel_err(step(tokens, positions, cache), expected)
            step.synchronize()      # a watchdog trip in the last steps: an error, not NaNs
            row |= {"ms_per_token": ms, "TBps": nbytes / ms / 1e9, "speedup": base / ms,
                    "rel_err": err}
        except (RuntimeError, ValueError) as err:  # does not fit, or a watchdog: go on
            row["error"] = str(err)[:300]
        rows.append(row)
    return rows


def winner_variants(ledger: str, batch: int, flags: list[str]) -> list[str]:
    """The variant an autotune ledger picked for ``batch`` (its last final round's winner, the
    kernel the tuned folder holds; without a final round, the fastest variant timed without an
    error), then it with each flag added (labels as parsed: a flag it already has adds
    nothing)."""
    if not Path(ledger).is_file():
        raise FileNotFoundError(f"no autotune ledger at {ledger}")
    book = Ledger(Path(ledger))                  # the file read once: its runs and final rounds
    finals = book.winners(batch)
    rows = [r for r in book.rows if r["batch"] == batch and not r.get("error")]
    if not rows and not finals:
        raise ValueError(f"{ledger} holds no timed variant of batch {batch}")
    best = variant.parse_variant(finals[-1] if finals
                                 else min(rows, key=lambda r: r["ms"])["variant"]).label
    labels = [variant.parse_variant(best + "".join(f"x{f}" for f in flag.split("+"))).label
              for flag in flags]
    return list(dict.fromkeys([best, *labels]))


def build_all(model, plan: dict[int, list[str]], context: int, jobs: int) -> list[str | None]:
    """Compile every (batch size, variant) of ``plan`` and build its kernel into Triton's cache
    in ``jobs`` worker processes, so that the timing loop only loads them (a failure shows
    there again); each job's error, if any."""
    from megakernel.compiler.pipeline import CompileOptions
    from megakernel.runtime.autotune import _prepare, fan_out
    from megakernel.runtime.megakernel import cache_dir

    dtype, root = next(model.parameters()).dtype, str(cache_dir() / "artifacts")
    return fan_out(_prepare, [(model.config, dtype, model.config.arch,
                               CompileOptions(b, context, target="h200", **parse_variant(v)), root,
                               "cuda") for b, variants in plan.items() for v in variants], jobs)


def round_args(p: argparse.ArgumentParser, winners_required: bool = False) -> None:
    """The options of the benches that time forms of one kernel in rounds (``sync_bound``,
    ``x_bound``, ``l2_persist``): model, batch sizes, context, an autotune ledger whose winner
    each batch size times, rounds, steps a timing, build processes and a JSON file."""
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch-sizes", "--batch-size", default="24")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--winners", default=None, required=winners_required,
                   help="an autotune.json: each batch size's winner")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--jobs", type=int, default=1, help="build the kernels in this many processes")
    p.add_argument("--json", default=None)


def kernel_rounds(step, kernels: dict, state: tuple, rounds: int,
                  iters: int) -> dict[str, list[float]]:
    """Each of ``kernels`` (name -> a build of ``step``'s generated module) bound to ``step`` in
    turn and timed on ``state`` (tokens, positions, cache), alternating for ``rounds`` rounds:
    name -> its median ms in each round."""
    tokens, positions, cache = state
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(rounds):
        for name, kernel in kernels.items():
            step.kernel = kernel
            times[name].append(median_step_ms(lambda: step(tokens, positions, cache),
                                              cache.device, 5, iters))
    return times


def collect_rows(batches: list[int], rows_of, line_of, json_path: str | None) -> list[dict]:
    """Each batch size's rows (``rows_of(batch)``), each printed as ``line_of(row)``; all of
    them written to ``json_path`` after each batch size (a run cut short keeps what it timed)."""
    rows = []
    for b in batches:
        for row in rows_of(b):
            print(line_of(row), flush=True)
            rows.append(row)
        if json_path:
            Path(json_path).write_text(json.dumps(rows, indent=1))
    return rows


def rounds_text(times: list[float]) -> str:
    return "rounds " + " ".join(f"{t:.3f}" for t in times)


def describe(model_name: str, row: dict, baseline: str, max_rel_err: float) -> str:
    head = f"{model_name} B={row['batch']} {row['variant']:<18}"
    if "error" in row:
        return f"{head} failed: {row['error'][:200]}"
    verdict = "" if row["rel_err"] <= max_rel_err else "  WRONG"
    return (f"{head} {row['ms_per_token']:7.3f} ms  {row['TBps']:5.2f} TB/s  x{row['speedup']:.2f} "
            f"vs {baseline} {row['baseline_ms']:.3f} ms  rel err {row['rel_err']:.1e}{verdict}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch-sizes", "--batch-size", default="1", help="e.g. 1,8,17")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--variants", default="64x256x4x132xs3")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--baseline", default="torch-compile", help="backend timed beside")
    p.add_argument("--max-rel-err", type=float, default=0.1)
    p.add_argument("--json", default=None)
    p.add_argument("--jobs", type=int, default=1,
                   help="build the kernels in this many processes first")
    p.add_argument("--winners", default=None,
                   help="an autotune.json: each batch size's winner instead of --variants")
    p.add_argument("--flags", default="",
                   help="with --winners: flags each also timed with, e.g. ar16,af+ar16")
    p.add_argument("--timing", default="median", choices=sorted(TIMINGS),
                   help="ms/token as the median gap between steps, or the mean of steps "
                        "launched back to back")
    args = p.parse_args(argv)
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    model = load_model(args.model, device=args.device, dtype=dtype, progress=False).model
    rows, batches = [], [int(b) for b in args.batch_sizes.split(",")]
    flags = [f for f in args.flags.split(",") if f]
    plan = {b: winner_variants(args.winners, b, flags) if args.winners
            else args.variants.split(",") for b in batches}
    if args.jobs > 1 and args.device == "cuda":
        build_all(model, plan, args.context, args.jobs)
    with torch.inference_mode():
        for batch in batches:
            for row in sweep_batch(model, batch, args.context, plan[batch], args.baseline,
                                   args.iters, args.timing):
                print(describe(args.model, row, args.baseline, args.max_rel_err), flush=True)
                rows.append(row)
            if args.json:  # after each batch size: a run cut short keeps what it timed
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    wrong = [r for r in rows if r.get("rel_err", 0.0) > args.max_rel_err]
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
