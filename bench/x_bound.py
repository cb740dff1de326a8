"""How much of a decode step the projections' reads of their input rows (x) cost, bounded from
above: one compiled kernel timed as built and with every projection step loading x otherwise
(no x at all, or one row of it for all B rows), side by side in one process.

    python -m megakernel.bench.x_bound --winners autotune.json --batch-sizes 24,64 --rounds 3

Every projection task (q/k/v, o, gate_up, down, lm_head; ``norm_ops.load_x``) reads its x
columns for all B rows in every step of its K loop, from L2: at 24-64 rows as many bytes as its
weights or more. Forms (``FORMS``): ``no-x`` loads no x at all (ones in its place), ``one-row``
reads row 0 for every row (the same loads, all rows at one address). Their logits are wrong by
design (their distance from eager's is printed beside) and only their time means anything:
``no-x`` bounds what sharing x between the tasks of an SM, or of a cluster, could save.
Rounds alternate the forms on one step's state; each form's figure is its median (on the GPU:
the interpreter runs whatever ``load_x`` is bound when a step runs, so there a form holds only
inside ``x_form``, where its logits are checked).

A form is built by swapping ``norm_ops.load_x`` for its stand-in while a fresh copy of the
generated module compiles (every ``megakernel`` JIT function's key computed again around it,
``jit_keys.forget``, so that Triton's cache keys see the swap), then putting the original back.
"""
from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from megakernel.compiler import norm_ops
from megakernel.compiler.norm_ops import step_index
from megakernel.runtime.jit_keys import forget


@triton.jit
def one_row_x(x_ptr, nw_ptr, k0, B: tl.constexpr, K: tl.constexpr, HAS_NORM: tl.constexpr,
              BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr = 1,
              KEND: tl.constexpr = 0):
    """``norm_ops.load_x`` with row 0's columns in every row: the same shapes and weights
    read, x's bytes from L2 cut to one row's."""
    LIM: tl.constexpr = KEND if KEND > 0 else K
    rows, ks = step_index(k0, BLOCK_B, BLOCK_K, FOLD)
    x = tl.load(x_ptr + rows[:, None] * 0 + ks, mask=(rows[:, None] < B) & (ks < LIM),
                other=0.0)
    w = 1.0
    if HAS_NORM:
        w = tl.load(nw_ptr + ks, mask=ks < LIM, other=0.0).to(tl.float32)
    return x, w


@triton.jit
def no_x(x_ptr, nw_ptr, k0, B: tl.constexpr, K: tl.constexpr, HAS_NORM: tl.constexpr,
         BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr = 1,
         KEND: tl.constexpr = 0):
    """``norm_ops.load_x`` with ones in place of x: the same shapes and weights read, no byte of
    x (nor of the norm weight) read at all."""
    rows, ks = step_index(k0, BLOCK_B, BLOCK_K, FOLD)
    x = (rows[:, None] * 0 + ks * 0 + 1).to(x_ptr.dtype.element_ty)
    return x, 1.0


FORMS = {"one-row": one_row_x, "no-x": no_x}     # form -> what stands for norm_ops.load_x


@contextmanager
def x_form(form: str):
    """While inside: projections built from here on load x as ``FORMS[form]`` does."""
    original = norm_ops.load_x
    norm_ops.load_x = FORMS[form]
    forget()
    try:
        yield
    finally:
        norm_ops.load_x = original
        forget()


def time_forms(model, label: str, batch: int, context: int, forms: list[str], rounds: int,
               iters: int) -> list:
    """Rows of one batch size: the kernel as built and each of ``forms``: its median ms over the
    rounds, its ratio to the kernel as built, and its logits' distance from eager's."""
    from megakernel.bench.decode import decode_state
    from megakernel.bench.sweep import kernel_rounds, parse_variant, rel_err
    from megakernel.runtime.megakernel import load_kernel, megakernel_backend

    tokens, positions, cache = state = decode_state(model, batch, context)
    step = megakernel_backend(model, cache, **parse_variant(label))
    kernels = {"as-built": step.kernel}
    with torch.inference_mode():
        expected = model(tokens, positions, cache)
        errs = {"as-built": rel_err(step(tokens, positions, cache), expected)}   # built first
        for form in forms:
            with x_form(form):
                step.kernel = kernels[form] = load_kernel(step.compiled.kernel.source,
                                                          step.compiled.kernel.kernel_name)
                errs[form] = rel_err(step(tokens, positions, cache), expected)
        step.synchronize()
        times = kernel_rounds(step, kernels, state, rounds, iters)
        step.synchronize()
    base = statistics.median(times["as-built"])
    return [{"batch": batch, "variant": label, "form": f, "ms": statistics.median(t),
             "ms_rounds": t, "vs_built": statistics.median(t) / base, "rel_err": errs[f]}
            for f, t in times.items()]


def main(argv: list[str] | None = None) -> int:
    from megakernel.bench.sweep import (build_all, collect_rows, round_args, rounds_text,
                                        winner_variants)
    from megakernel.models import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    round_args(p)
    p.add_argument("--variant", default="64x256x4x132xs3", help="without --winners")
    p.add_argument("--forms", default="no-x,one-row", help=f"of {', '.join(FORMS)}")
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    args = p.parse_args(argv)
    forms = args.forms.split(",")
    for f in forms:
        if f not in FORMS:
            raise SystemExit(f"form {f!r} unknown; choose from {', '.join(FORMS)}")
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    model = load_model(args.model, device=args.device, dtype=dtype, progress=False).model
    batches = [int(b) for b in args.batch_sizes.split(",")]
    labels = {b: winner_variants(args.winners, b, [])[0] if args.winners else args.variant
              for b in batches}
    if args.jobs > 1 and args.device == "cuda":      # the kernels as built; the forms later
        build_all(model, {b: [v] for b, v in labels.items()}, args.context, args.jobs)
    collect_rows(batches, lambda b: time_forms(model, labels[b], b, args.context, forms,
                                               args.rounds, args.iters),
                 lambda row: f"{args.model} B={row['batch']} {row['form']:<8} "
                             f"{row['ms']:7.3f} ms  x{row['vs_built']:.3f} of as-built  "
                             f"rel err {row['rel_err']:.1e}  {rounds_text(row['ms_rounds'])}",
                 args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
