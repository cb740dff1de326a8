"""Where the megakernel's warps stall: one decode step for Nsight Compute, and a summary of its
SASS source page.

    ncu --clock-control none -k regex:megakernel_step --launch-skip 3 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters --import-source yes -o step \\
        python -m megakernel.bench.ncu_step --model llama-3.2-1b --batch-size 1
    ncu -i step.ncu-rep --page source --csv --print-source sass > step.csv
    python -m megakernel.bench.ncu_step --summarize step.csv

The step runs four times (three warm-ups, then the one profiled). The summary gives the warp
stall samples by reason, by instruction and by runs of instructions (the persistent loop's
wait, each op body), with the instructions that tell those regions apart.
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter

import torch

from megakernel.bench.decode import decode_state
from megakernel.bench.sweep import parse_variant
from megakernel.models import load_model
from megakernel.runtime.megakernel import megakernel_backend

SAMPLES = "Warp Stall Sampling (All Samples)"
MARKS = ("HMMA", "LDGSTS", "LDG", "MUFU.EX2", "ATOMG", "RED", "BAR.SYNC", "STG", "CCTL.IVALL",
         "CCTL.E.PF2", "MEMBAR")        # what tells the regions of the kernel apart


def run_steps(model_name: str, batch: int, context: int, label: str | None, steps: int) -> None:
    model = load_model(model_name, device="cuda", dtype="bfloat16", progress=False).model
    tokens, positions, cache = decode_state(model, batch, context)
    options = parse_variant(label) if label else {}
    step = megakernel_backend(model, cache, **options)
    with torch.inference_mode():
        for _ in range(steps):
            step(tokens, positions, cache)
    torch.cuda.synchronize()


def _int(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(float(text)) if text else 0


def _opcode(row: dict) -> str:
    """An instruction's opcode with its modifiers (its predicate left out)."""
    return next((w for w in row["Source"].split() if not w.startswith("@")), "")


def summarize(rows: list[dict], top: int = 40, width: int = 100) -> str:
    """A report of the SASS source page (rows: its CSV rows, one per instruction): the share of
    warp stall samples per stall reason, the ``top`` instructions holding the most samples, and
    the samples of each run of ``width`` instructions with the marker instructions in it."""
    if not rows or SAMPLES not in rows[0]:
        raise ValueError(f"no {SAMPLES!r} column among {list(rows[0]) if rows else []}")
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    samples = [_int(r[SAMPLES]) for r in rows]
    total = sum(samples) or 1
    by_reason = Counter({c: sum(_int(r[c]) for r in rows) for c in reasons})
    out = [f"{len(rows)} instructions, {total} samples"]
    out += [f"{n / total:7.2%}  {c}" for c, n in by_reason.most_common(12)]
    out.append("top instructions: index, share, main reason, executed, instruction")
    for i in sorted(range(len(rows)), key=lambda i: -samples[i])[:top]:
        main = max(reasons, key=lambda c: _int(rows[i][c]))
        out.append(f"{i:6d} {samples[i] / total:6.2%} {main:18s} "
                   f"{_int(rows[i]['Instructions Executed']):9d} {rows[i]['Source'].strip()[:80]}")
    out.append(f"runs of {width} instructions: first index, share, most executed, markers")
    for b in range(0, len(rows), width):
        seg = rows[b:b + width]
        ops = Counter(m for r in seg for m in MARKS
                      if _opcode(r) == m or _opcode(r).startswith(m + "."))
        out.append(f"{b:6d} {sum(samples[b:b + width]) / total:6.2%} "
                   f"{max(_int(r['Instructions Executed']) for r in seg):9d} "
                   + " ".join(f"{m}:{n}" for m, n in ops.items()))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--variant", default=None, help="variant label (runtime/variant.py)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--summarize", metavar="CSV", help="summarise this source-page CSV instead")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args(argv)
    if args.summarize:
        with open(args.summarize, newline="") as f:
            lines = [ln for ln in f if ln.strip() and not ln.startswith("==")]
        start = next(i for i, ln in enumerate(lines) if ln.startswith('"Address"'))
        print(summarize(list(csv.DictReader(lines[start:])), args.top))
        return
    if not torch.cuda.is_available():
        sys.exit("ncu_step needs a GPU")
    run_steps(args.model, args.batch_size, args.context, args.variant, args.steps)


if __name__ == "__main__":
    main()
