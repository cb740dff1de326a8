"""Weights staged in shared memory before a task's waits (sm_90: the TMA engine's bulk copies
and an mbarrier, through inline PTX; in place under the interpreter).

A kernel built with ``STAGE`` bytes of staging launches with that much dynamic shared memory
beyond what Triton allocates (``runtime.megakernel.reserve_staging``), so the area is the last
``STAGE`` bytes of the block's dynamic shared memory: an mbarrier in its first 8 bytes, data from
byte ``HEAD`` on. A task whose op stages (its registry entry's ``stage`` body) starts copying
its first SR weight rows whole before it waits (``issue_rows``: thread 0 arms the barrier with
the byte count and starts one bulk copy a weight matrix); once its inputs are ready, the op
body streams its other rows from global memory, then every thread waits for the barrier's
phase (``ready``) and reads the staged rows where ``rows_at`` says (``staged_row``: 16 bytes a
load, multiplied word by word). Weights depend on nobody, so the copy runs while the task
waits and streams, into the worker's own shared memory. Under the interpreter (STAGE ==
IN_PLACE) nothing is copied or waited for and the same rows are read in place, 4 bytes a
load, so that the CPU runs every other part of a staging kernel. Invariants: one staged task
at a time per worker (the previous task's signal ends with a barrier of all its threads, so no
thread still reads the area when the next copy starts); the n-th staged task of a worker waits
for phase parity n % 2; 2-byte weights only; the kernel has shared memory of Triton's own (its
``global_smem`` symbol: every megakernel's pipelines).
"""
import triton
import triton.language as tl

from .cost import STAGE_HEAD, STAGE_IN_PLACE

HEAD = tl.constexpr(STAGE_HEAD)
IN_PLACE = tl.constexpr(STAGE_IN_PLACE)


@triton.jit
def area(STAGE: tl.constexpr):
    """Shared-memory address of the staging area: the block's last STAGE bytes."""
    size = tl.inline_asm_elementwise("mov.u32 $0, %dynamic_smem_size;", "=r,r", [STAGE],
                                     dtype=tl.int32, is_pure=True, pack=1)
    base = tl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r,r", [STAGE],
                                     dtype=tl.int32, is_pure=True, pack=1)
    return base + size - STAGE


@triton.jit
def init(STAGE: tl.constexpr):
    """Once per worker, before its first task: the mbarrier expects one arrival a phase."""
    if STAGE > IN_PLACE:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0;\n"
            "@p mbarrier.init.shared::cta.b64 [$1], 1;\n"
            "@p fence.proxy.async.shared::cta; mov.u32 $0, 0; }",
            "=r,r", [area(STAGE)], dtype=tl.int32, is_pure=False, pack=1)
        tl.debug_barrier()


@triton.jit
def _copy(mbar, dst, src, nbytes, expect):
    """Thread 0: arm the barrier for ``expect`` more bytes (if any), then copy ``nbytes`` from
    global ``src`` to shared ``dst`` through the TMA engine, counted on the barrier."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p, q; .reg .u32 t; .reg .b64 s; mov.u32 t, %tid.x;\n"
        "setp.eq.u32 p, t, 0; setp.ne.and.u32 q, $5, 0, p;\n"
        "@q fence.proxy.async.shared::cta;\n"
        "@q mbarrier.arrive.expect_tx.shared::cta.b64 s, [$1], $5;\n"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [$2], [$3], $4, [$1];\n"
        "mov.u32 $0, 0; }",
        "=r,r,r,l,r,r", [mbar, dst, src, nbytes, expect], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def issue_rows(src, rows, K: tl.constexpr, SR: tl.constexpr, STAGE: tl.constexpr,
               AT: tl.constexpr = 0, ARM: tl.constexpr = 1):
    """Start copying the first min(rows, SR) of ``rows`` rows of K 2-byte elements from ``src``
    (16-byte aligned) whole into the area, from its row AT (rows K elements apart): one range,
    one bulk copy; the barrier armed for ARM such calls' bytes (a task's first call arms for
    all of them, the others 0); returns 1 (0 where SR is 0: nothing staged)."""
    started = 0
    if SR > 0:
        if STAGE > IN_PLACE:
            mbar = area(STAGE)
            nbytes = tl.minimum(rows, SR) * K * 2
            _copy(mbar, mbar + HEAD + AT * K * 2, src, nbytes, ARM * nbytes)
        started = 1
    return started


@triton.jit
def ready(copy, STAGE: tl.constexpr):
    """Wait until the worker's copy number ``copy`` (from 0) has landed. (The wait and the
    reads are asm with side effects, which the compiler keeps in program order.)"""
    if STAGE > IN_PLACE:
        done = 0
        while done == 0:
            done = tl.inline_asm_elementwise(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n"
                "selp.u32 $0, 1, 0, p; }",
                "=r,r,r", [area(STAGE), copy % 2], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def rows_at(src, AT: tl.constexpr, K: tl.constexpr, STAGE: tl.constexpr):
    """Where the rows that a task's ``issue_rows`` copied from ``src`` (to area row AT) are
    read: their shared address, or (STAGE == IN_PLACE, the interpreter's staging) ``src``."""
    if STAGE > IN_PLACE:
        return area(STAGE) + HEAD + AT * K * 2
    else:
        return src


@triton.jit
def _half(v, HIGH: tl.constexpr, DT: tl.constexpr):
    """The low (or HIGH) 2-byte element of each 4-byte word ``v``, as DT."""
    bits = (v >> 16) & 0xFFFF if HIGH else v & 0xFFFF
    return bits.to(tl.int16).to(DT, bitcast=True)


@triton.jit
def _load_words(base, words, STAGE: tl.constexpr):
    """Words ``words`` .. ``words`` + 3 (4-byte, ``words`` a multiple of 4) of the rows at
    ``base`` (``rows_at``): one vector load from shared memory (asm with side effects: kept
    after ``ready``'s wait), or four loads in place."""
    if STAGE > IN_PLACE:
        return tl.inline_asm_elementwise(
            "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", [base + 4 * words],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)
    else:
        p = base.to(tl.pointer_type(tl.int32), bitcast=True) + words
        return tl.load(p), tl.load(p + 1), tl.load(p + 2), tl.load(p + 3)


@triton.jit
def _as_f32(v, HIGH: tl.constexpr, DT: tl.constexpr):
    """The low (or HIGH) 2-byte element of each 4-byte word ``v`` (of type DT) in fp32."""
    if DT == tl.bfloat16:       # a bf16 is an fp32's upper half
        bits = v & -65536 if HIGH else v << 16
        return bits.to(tl.float32, bitcast=True)
    else:
        return _half(v, HIGH, DT).to(tl.float32)


@triton.jit
def _x_half(xw, nw, rstd, HIGH: tl.constexpr, HAS_NORM: tl.constexpr, DT: tl.constexpr):
    """The low (or HIGH) x element (type DT) of each 4-byte word ``xw``, [norm](x) rounded as
    ``norm_ops.load_normed`` rounds (``nw`` the norm weight's words), in fp32."""
    x = _as_f32(xw, HIGH, DT)
    if HAS_NORM:
        x = (_as_f32(nw, HIGH, DT) * (x * rstd).to(DT).to(tl.float32)).to(DT).to(tl.float32)
    return x


@triton.jit
def _x_words(xw_ptr, nw_words, words, mask, rstd, HAS_NORM: tl.constexpr, DT: tl.constexpr):
    """(low, high): ``_x_half`` of x's 4-byte words ``words`` (0 where not ``mask``)."""
    xw = tl.load(xw_ptr + words, mask=mask, other=0)
    nw = tl.load(nw_words + words, mask=mask, other=0) if HAS_NORM else 0
    return (_x_half(xw, nw, rstd, False, HAS_NORM, DT),
            _x_half(xw, nw, rstd, True, HAS_NORM, DT))


@triton.jit
def staged_row(x_ptr, nw_ptr, rstd, sbase, end, HAS_NORM: tl.constexpr, SR: tl.constexpr,
               N: tl.constexpr, DT: tl.constexpr, WT: tl.constexpr, K: tl.constexpr,
               STAGE: tl.constexpr):
    """[norm](x) . W[j] for one row x of K elements (``x_ptr`` at its first, 2-byte type DT,
    ``rstd`` its RMS factor) and the SR rows j (type WT) staged whole at ``sbase`` (``rows_at``)
    -> [N] fp32 (N >= SR; 0 for rows j >= SR or j >= end); K a multiple of 8. Word-wise, a
    warp's lanes across 32 consecutive 16-byte groups g of a row, rows across warps: each 16
    bytes at (row j, group g) are four words of two weights, multiplied by the same words of x
    (normed as ``norm_ops.load_normed`` norms; groups past the row read group 0 times x 0),
    summed per (j, lane) in fp32 and across a warp's lanes once at the end."""
    G: tl.constexpr = K // 8
    L: tl.constexpr = min(32, triton.next_power_of_2(G))
    js = tl.arange(0, SR)[:, None]                                        # [SR, 1]
    xw_ptr = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    nw_words = nw_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    acc = tl.zeros([SR, L], tl.float32)
    for g0 in tl.range(0, G, L):
        gs = g0 + tl.arange(0, L)[None, :]                                # [1, L]
        ok = gs < G
        v0, v1, v2, v3 = _load_words(sbase, js * (K // 2) + 4 * tl.where(ok, gs, 0), STAGE)
        x0, x1 = _x_words(xw_ptr, nw_words, 4 * gs, ok, rstd, HAS_NORM, DT)
        x2, x3 = _x_words(xw_ptr, nw_words, 4 * gs + 1, ok, rstd, HAS_NORM, DT)
        x4, x5 = _x_words(xw_ptr, nw_words, 4 * gs + 2, ok, rstd, HAS_NORM, DT)
        x6, x7 = _x_words(xw_ptr, nw_words, 4 * gs + 3, ok, rstd, HAS_NORM, DT)
        acc += _as_f32(v0, False, WT) * x0 + _as_f32(v0, True, WT) * x1  # [SR, L]
        acc += _as_f32(v1, False, WT) * x2 + _as_f32(v1, True, WT) * x3
        acc += _as_f32(v2, False, WT) * x4 + _as_f32(v2, True, WT) * x5
        acc += _as_f32(v3, False, WT) * x6 + _as_f32(v3, True, WT) * x7
    sums = tl.sum(acc, axis=1)                                            # [SR]
    rows = tl.arange(0, N)
    out = tl.sum(tl.where(rows[:, None] == tl.arange(0, SR)[None, :], sums[None, :], 0.0), 1)
    return tl.where(rows < end, out, 0.0)                                 # [N]
