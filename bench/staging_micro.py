"""Where a staged projection task's time goes, apart from the megakernel (GPU, sm_90).

    python -m megakernel.bench.staging_micro [--k 2048 --rows 16 --tasks 4096 --staged-rows 16]

One program per SM walks tasks t = pid, pid + SMS, ...; task t computes out[t] = W[t % D] @ x
for W [D, rows, k] bf16 (rows x k weights a task, the batch-1 o projection's shape by default;
D ``--distinct`` blocks, by default one a task: with few, the weights stay in L2), in one of
these modes, each timed alone (median of CUDA-event timings, GB/s of weights):
  global   every row streamed from global memory as the op bodies' projection loop does
           (``load_normed``, ``load_w``, ``_mac``: Triton's pipelined loads, ``--stages``
           of them, in the projection ``--form``)
  staged   a bulk copy of the task's first staged-rows rows (``staging.issue_rows``), the
           other rows streamed as ``global`` (none where all are staged), then the copy's
           wait (``staging.ready``) and its read (``ops.staged_product``)
  copy     ``staged`` without the read
  read     ``staged`` without the copy and its wait (reads whatever the area holds)
  ahead    ``staged`` with the next task's copy started as soon as this task's read is done
Only ``global``, ``staged`` and ``ahead`` are checked against torch (relative norm of the
difference; the others compute nothing right).
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from megakernel.compiler import ops, staging
from megakernel.compiler.norm_ops import load_normed
from megakernel.compiler.cost import STAGE_HEAD
from megakernel.runtime.residency import reserve_staging

MODES = {"global": 0, "staged": 1, "copy": 2, "read": 3, "ahead": 4}


@triton.jit
def _stream(x_ptr, src, K: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
            SKIP: tl.constexpr, STAGES: tl.constexpr = 3, FORM: tl.constexpr = 1):
    """[1, ROWS] fp32: the task's rows from SKIP on from global memory (the others 0), as the
    op bodies' projection loop reads them (Triton's pipelined loads, ``ops._mac`` in the
    projection FORM: 1 multiply-and-sum, 0 tensor cores with x padded to 16 rows)."""
    BB: tl.constexpr = 1 if FORM == 1 else 16
    acc = tl.zeros([BB, ROWS], tl.float32)
    rstd = tl.zeros([BB], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        a = load_normed(x_ptr, x_ptr, rstd, k0, 1, K, False, BB, BLOCK_K, tl.bfloat16)
        w = ops.load_w(src, 0, ROWS, 0, k0, K, ROWS, ROWS, BLOCK_K, SKIP=SKIP)
        acc = ops._mac(a, w.to(tl.bfloat16), acc, FORM, tl.bfloat16)
    return tl.sum(tl.where(tl.arange(0, BB)[:, None] == 0, acc, 0.0), axis=0)[None, :]


@triton.jit
def _tasks(w_ptr, x_ptr, out_ptr, sink_ptr, TASKS: tl.constexpr, ROWS: tl.constexpr,
           K: tl.constexpr, SR: tl.constexpr, BLOCK_K: tl.constexpr,
           MODE: tl.constexpr, SMS: tl.constexpr, STAGE: tl.constexpr,
           DISTINCT: tl.constexpr, STAGES: tl.constexpr, FORM: tl.constexpr):
    pid = tl.program_id(0)
    staging.init(STAGE)
    rstd = tl.zeros([1], tl.float32)
    SKIP: tl.constexpr = 0 if MODE == 0 else SR
    COPY: tl.constexpr = MODE == 1 or MODE == 2
    READ: tl.constexpr = MODE == 1 or MODE == 3 or MODE == 4
    if MODE == 4:
        staging.issue_rows(w_ptr + pid * ROWS * K, ROWS, K, SR, STAGE)
    acc = tl.zeros([1, ROWS], tl.float32)
    n = 0
    t = pid
    while t < TASKS:
        src = w_ptr + (t % DISTINCT).to(tl.int64) * ROWS * K
        if COPY:
            staging.issue_rows(src, ROWS, K, SR, STAGE)
        if SKIP < ROWS:
            acc = _stream(x_ptr, src, K, ROWS, BLOCK_K, SKIP, STAGES, FORM)
        else:
            acc = tl.zeros([1, ROWS], tl.float32)
        if MODE != 0:
            if MODE != 3:
                staging.ready(n, STAGE)
            if READ:
                acc += ops.staged_product(x_ptr, x_ptr, rstd, staging.rows_at(src, 0, K, STAGE),
                                          ROWS, 1, K, False, 1, ROWS, tl.bfloat16, tl.bfloat16,
                                          SR, STAGE)
            n += 1
        tl.debug_barrier()          # every read of the area done before the next copy
        if MODE == 4 and t + SMS < TASKS:
            staging.issue_rows(src + SMS * ROWS * K, ROWS, K, SR, STAGE)
        tl.store(out_ptr + t * ROWS + tl.arange(0, ROWS)[None, :], acc)
        t += SMS
    # a sum across warps keeps shared memory of Triton's own in every mode (the area's symbol)
    spread = tl.arange(0, 1024).to(tl.float32) * tl.sum(tl.sum(acc, axis=1), axis=0)
    tl.store(sink_ptr + pid, tl.sum(spread, axis=0))


def run(mode: str, w, x, tasks: int, sr: int, block_k: int, stages: int, form: int,
        iters: int) -> tuple[float, float]:
    """(GB/s of weights read, relative error against torch or nan) of one mode; task t reads
    w[t % len(w)] (fewer distinct tasks than tasks: weights that stay in L2)."""
    distinct, rows, k = w.shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.full((tasks, rows), float("nan"), device="cuda")
    sink = torch.zeros(sms, device="cuda")
    stage = sr * k * 2 + STAGE_HEAD
    args = (w, x, out, sink, tasks, rows, k, sr, block_k, MODES[mode], sms, stage, distinct,
            stages, form)
    built = _tasks.warmup(*args, grid=(sms,))
    reserve_staging(built, stage)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _tasks[(sms,)](*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    ms = sorted(times)[len(times) // 2]
    err = float("nan")
    if mode in ("global", "staged", "ahead"):
        ref = (w.float() @ x.float()[0]).float()[torch.arange(tasks, device="cuda") % distinct]
        err = ((out - ref).norm() / ref.norm()).item()
    return tasks * rows * k * 2 / ms / 1e6, err


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--tasks", type=int, default=4096)
    p.add_argument("--distinct", type=int, default=0,
                   help="distinct weight blocks, task t reading t %% N (default: --tasks)")
    p.add_argument("--staged-rows", type=int, default=16, help="rows staged a task (2^n)")
    p.add_argument("--block-k", type=int, default=1024)
    p.add_argument("--stages", type=int, default=3, help="pipeline stages of the streamed loop")
    p.add_argument("--form", type=int, default=1, choices=(0, 1),
                   help="streamed product: 1 multiply-and-sum, 0 tensor cores")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--modes", default=",".join(MODES))
    args = p.parse_args()
    distinct = args.distinct or args.tasks
    if distinct < args.tasks and "ahead" in args.modes.split(","):
        p.error("--modes ahead copies the next distinct task's rows: not with --distinct")
    w = torch.randn(distinct, args.rows, args.k, device="cuda").to(torch.bfloat16)
    x = torch.randn(1, args.k, device="cuda").to(torch.bfloat16)
    for mode in args.modes.split(","):
        gbs, err = run(mode, w, x, args.tasks, args.staged_rows, args.block_k, args.stages,
                       args.form, args.iters)
        print(f"{mode:7s} k {args.k} rows {args.rows} staged {args.staged_rows} distinct "
              f"{distinct} block_k {args.block_k} stages {args.stages} form {args.form}: "
              f"{gbs:7.1f} GB/s  rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
