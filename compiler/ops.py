"""Op bodies of the megakernel: real ``@triton.jit`` functions, each one tile task.

Every body reads and writes through plain pointers and compile-time sizes, so each is tested on
its own against PyTorch. Rounding follows the eager model: values are rounded to the model dtype
``DT`` wherever eager PyTorch materialises a tensor (after each projection, norm and RoPE term),
while sums run in fp32. Shapes: activations are row-major [B, N]; the cache is
[L, 2, B, Hkv, S, D], addressed through a block table [B, S / BS] of physical block ids (block p
is the (p % (S / BS))-th block of row p // (S / BS) of the static cache).
"""
import triton
import triton.language as tl

from . import staging
from .norm_ops import _round, first_rstd, load_normed, row_rstd, rows_after, step_index
from .rope_ops import _store_halves, cross_rope_store, norm_rope_store, rope_inputs


@triton.jit
def _dot(a, b, acc, DT: tl.constexpr):
    if DT == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _mac(a, w, acc, FORM: tl.constexpr, DT: tl.constexpr):
    """acc + a @ w^T for a [BB, BK], w [BN, BK], as the projection FORM computes it:
    0 tensor cores, batch rows as the dot's M (padded to 16); 1 a plain multiply-and-sum that
    keeps fewer registers per weight byte (small batches); 2 tensor cores with weight rows as M
    (acc held transposed, [BN, BB]: M of 64 and more can use Hopper's warpgroup MMA)."""
    if FORM == 1:
        return acc + tl.sum(a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    elif FORM == 2:
        return _dot(w, tl.trans(a), acc, DT)
    else:
        return _dot(a, tl.trans(w), acc, DT)


@triton.jit
def _acc0(BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, FORM: tl.constexpr):
    """A zero accumulator in the FORM's orientation."""
    if FORM == 2:
        return tl.zeros([BLOCK_N, BLOCK_B], tl.float32)
    else:
        return tl.zeros([BLOCK_B, BLOCK_N], tl.float32)


@triton.jit
def _result(acc, FORM: tl.constexpr):
    """An accumulator as [BLOCK_B, BLOCK_N]."""
    if FORM == 2:
        return tl.trans(acc)
    else:
        return acc


@triton.jit
def load_w(w_ptr, base, end, STRIDE: tl.constexpr, k0, K: tl.constexpr, BLOCK_N: tl.constexpr,
           HALF: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr = 1,
           KEND: tl.constexpr = 0, WRAP: tl.constexpr = 0, SKIP: tl.constexpr = 0):
    """Weight rows base + j % HALF + (j // HALF) * STRIDE for j < BLOCK_N (rows with
    j % HALF >= end read as 0), columns [k0, k0 + BLOCK_K) of W [N, K] -> [BLOCK_N, BLOCK_K];
    from KEND (0: K) on nothing is read. FOLD > 1: [FOLD * BLOCK_N, BLOCK_K / FOLD], row
    q * BLOCK_N + j holding row j's q-th slice of the columns. WRAP > 0: base + j % HALF counts
    pairs of rows laid end to end over heads of WRAP rows (pair p: row (p // STRIDE) * WRAP +
    p % STRIDE, its partner STRIDE rows further). SKIP (plain rows): rows j < SKIP read as 0
    (staged in shared memory instead)."""
    LIM: tl.constexpr = KEND if KEND > 0 else K
    j, ks = step_index(k0, BLOCK_N, BLOCK_K, FOLD)
    if HALF == BLOCK_N:
        ns, nmask = base + j, (j < end) & (j >= SKIP)
    elif WRAP > 0:
        pair = base + j % HALF
        ns = (pair // STRIDE) * WRAP + pair % STRIDE + (j // HALF) * STRIDE
        nmask = j % HALF < end
    else:
        ns, nmask = base + j % HALF + (j // HALF) * STRIDE, j % HALF < end
    return tl.load(w_ptr + ns[:, None] * K + ks, mask=nmask[:, None] & (ks < LIM), other=0.0)


@triton.jit
def staged_product(x_ptr, nw_ptr, rstd, sbase, end, B: tl.constexpr, K: tl.constexpr,
                   HAS_NORM: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                   DT: tl.constexpr, WT: tl.constexpr, SR: tl.constexpr, STAGE: tl.constexpr):
    """[norm(x)] @ W[rows]^T -> [BLOCK_B, BLOCK_N] fp32 from a task's first SR rows j (of type WT;
    j < end), staged whole at ``sbase`` (``staging.rows_at``), 0 in the other columns:
    ``staging.staged_row`` for each batch row."""
    rows = tl.arange(0, BLOCK_B)
    out = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    for b in tl.static_range(BLOCK_B):
        if b < B:
            rs = tl.sum(tl.where(rows == b, rstd, 0.0), axis=0)
            r = staging.staged_row(x_ptr + b * K, nw_ptr, rs, sbase, end, HAS_NORM, SR,
                                   BLOCK_N, DT, WT, K, STAGE)                       # [BLOCK_N]
            out = tl.where(rows[:, None] == b, r[None, :], out)
    return out


@triton.jit
def fold_rows(vals, FOLD: tl.constexpr, BLOCK_B: tl.constexpr):
    """[BLOCK_B] -> [FOLD * BLOCK_B], value b at every folded row q * BLOCK_B + b."""
    if FOLD == 1:
        return vals
    else:
        return tl.reshape(tl.broadcast_to(vals[None, :], [FOLD, BLOCK_B]), [FOLD * BLOCK_B])


@triton.jit
def unfold(acc, FORM: tl.constexpr, FOLD: tl.constexpr, BLOCK_B: tl.constexpr,
           BLOCK_N: tl.constexpr):
    """An accumulator as [BLOCK_B, BLOCK_N]. Folded, [FOLD * BLOCK_B, FOLD * BLOCK_N]: the sum
    over q of the blocks where row slice q met column slice q (the others mixed slices)."""
    if FOLD == 1:
        return _result(acc, FORM)
    else:
        a4 = tl.reshape(acc, [FOLD, BLOCK_B, FOLD, BLOCK_N])
        same = tl.arange(0, FOLD)[:, None, None, None] == tl.arange(0, FOLD)[None, None, :, None]
        return tl.sum(tl.sum(tl.where(same, a4, 0.0), axis=2), axis=0)


@triton.jit
def first_step(base, end, LIM: tl.constexpr, BLOCK_K: tl.constexpr, ROTATE: tl.constexpr):
    """The column a rotated K loop of a task (first weight row ``base``, ``end`` rows) starts
    at: its index among tasks of its width, modulo the loop's steps, times BLOCK_K, so that
    tasks side by side read different columns of x at once (0 where ROTATE is off, or the
    steps do not tile [0, LIM) exactly)."""
    STEPS: tl.constexpr = LIM // BLOCK_K
    if ROTATE and LIM % BLOCK_K == 0 and STEPS > 1:
        return (base // tl.maximum(end, 1)) % STEPS * BLOCK_K
    else:
        return 0


@triton.jit
def loop_column(i, rot, LIM: tl.constexpr, BLOCK_K: tl.constexpr, ROTATE: tl.constexpr):
    """The column a K loop over [0, LIM) in BLOCK_K steps reads at its trip from column i:
    i, or (ROTATE) i from column ``rot`` (``first_step``) on, wrapping around, declared a
    multiple of BLOCK_K (without it, sm_90 builds lose the loop's async copies)."""
    return tl.multiple_of((i + rot) % LIM, BLOCK_K) if ROTATE else i


@triton.jit
def matmul_tile(x_ptr, nw_ptr, rstd, w_ptr, base, end, STRIDE: tl.constexpr, B: tl.constexpr,
                K: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK_B: tl.constexpr,
                BLOCK_N: tl.constexpr, HALF: tl.constexpr, BLOCK_K: tl.constexpr,
                DT: tl.constexpr, FORM: tl.constexpr, STAGES: tl.constexpr,
                FOLD: tl.constexpr = 1, KEND: tl.constexpr = 0, WRAP: tl.constexpr = 0,
                copy=0, STAGE: tl.constexpr = 0, STAGED_ROWS: tl.constexpr = 0,
                ROTATE: tl.constexpr = 0):
    """[norm(x)] @ W[rows]^T for W [N, K] row-major and the rows of ``load_w`` (base, end,
    STRIDE, HALF) -> [BLOCK_B, BLOCK_N] fp32, in the projection FORM (see ``_mac``).
    Triton's software pipeliner stages STAGES chunks through shared memory.
    FOLD > 1 (FORM 0): each step's columns cut into FOLD slices, stacked as rows of x and of W,
    so that a narrow task's dot is [FOLD * BLOCK_B, BLOCK_K / FOLD] @ [.., FOLD * BLOCK_N]: the
    same bytes, no batch rows padded to 16 when FOLD * BLOCK_B >= 16, and no warp re-reading
    the whole x step from shared memory for a few columns each. KEND > 0: only the first KEND
    columns of each row (rows still K apart), for a K slice. WRAP: as ``load_w``'s. STAGE > 0
    (a kernel with staging; plain rows base..base + end, whole K, only): the first STAGED_ROWS
    rows from the worker's staged copy number ``copy`` (``staged_product``, after the rows
    that stream (none where all BLOCK_N are staged), so that the copy lands meanwhile).
    ROTATE: the loop from a step of its own on (``first_step``), wrapping around."""
    LIM: tl.constexpr = KEND if KEND > 0 else K
    SR: tl.constexpr = STAGED_ROWS if STAGE > 0 else 0
    rs = fold_rows(rstd, FOLD, BLOCK_B)
    acc = _acc0(FOLD * BLOCK_B, FOLD * BLOCK_N, FORM)
    if SR < BLOCK_N:
        rot = first_step(base, end, LIM, BLOCK_K, ROTATE)
        for i in tl.range(0, LIM, BLOCK_K, num_stages=STAGES):
            k0 = loop_column(i, rot, LIM, BLOCK_K, ROTATE)
            a = load_normed(x_ptr, nw_ptr, rs, k0, B, K, HAS_NORM, BLOCK_B, BLOCK_K, DT, FOLD,
                            KEND)
            w = load_w(w_ptr, base, end, STRIDE, k0, K, BLOCK_N, HALF, BLOCK_K, FOLD, KEND,
                       WRAP, SR)
            acc = _mac(a, w.to(DT), acc, FORM, DT)
    out = unfold(acc, FORM, FOLD, BLOCK_B, BLOCK_N)
    if SR > 0:
        staging.ready(copy, STAGE)
        sbase = staging.rows_at(w_ptr + base.to(tl.int64) * K, 0, K, STAGE)
        out += staged_product(x_ptr, nw_ptr, rstd, sbase, end, B, K, HAS_NORM, BLOCK_B, BLOCK_N,
                              DT, w_ptr.dtype.element_ty, SR, STAGE)
    return out


@triton.jit
def store_rows(ptr, vals, n0, n_hi, B: tl.constexpr, N: tl.constexpr, BLOCK_B: tl.constexpr,
               BLOCK_N: tl.constexpr):
    rows = tl.arange(0, BLOCK_B)
    ns = n0 + tl.arange(0, BLOCK_N)
    tl.store(ptr + rows[:, None] * N + ns[None, :], vals,
             mask=(rows[:, None] < B) & (ns[None, :] < n_hi))


@triton.jit
def store_norm_inputs(ss_ptr, sc_ptr, y, w, g, n0, n_hi, B: tl.constexpr, N: tl.constexpr,
                      BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
    """What the next op's norm takes (``TileConfig.norm_sums``, see ``tile_norm``) from columns
    [n0, n_hi) of x, column group g, y [BLOCK_B, BLOCK_N] fp32 (0 where masked): their sums of
    squares of each row into ss[g, :B], and y times the norm's weight w [BLOCK_N] into
    sc [B, N]."""
    rows = tl.arange(0, BLOCK_B)
    tl.store(ss_ptr + g * B + rows, tl.sum(y * y, axis=1), mask=rows < B)
    store_rows(sc_ptr, (y * w[None, :]).to(sc_ptr.dtype.element_ty), n0, n_hi, B, N, BLOCK_B,
               BLOCK_N)


@triton.jit
def embed_op(tokens_ptr, table_ptr, out_ptr, ss_ptr, nw_ptr, sc_ptr, n0, B: tl.constexpr,
             H: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
             SUMS: tl.constexpr = False):
    """out[:, n0:n0+BLOCK_N] = table[tokens, n0:n0+BLOCK_N]; SUMS: what the next op's norm
    takes of those columns too (``store_norm_inputs``)."""
    rows = tl.arange(0, BLOCK_B)
    ns = n0 + tl.arange(0, BLOCK_N)
    tok = tl.load(tokens_ptr + rows, mask=rows < B, other=0).to(tl.int64)
    mask = (rows[:, None] < B) & (ns[None, :] < H)
    vals = tl.load(table_ptr + tok[:, None] * H + ns[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + rows[:, None] * H + ns[None, :], vals, mask=mask)
    if SUMS:
        w = tl.load(nw_ptr + ns, mask=ns < H, other=0.0).to(tl.float32)           # [BLOCK_N]
        store_norm_inputs(ss_ptr, sc_ptr, vals.to(tl.float32), w, n0 // BLOCK_N, n0, H, B, H,
                          BLOCK_B, BLOCK_N)


@triton.jit
def linear_op(x_ptr, w_ptr, nw_ptr, res_ptr, out_ptr, ss_ptr, os_ptr, onw_ptr, osc_ptr, n0, n1,
              g, copy, STAGE: tl.constexpr, eps: tl.constexpr, B: tl.constexpr,
              K: tl.constexpr, N: tl.constexpr,
              HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_B: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
              FORM: tl.constexpr, STAGES: tl.constexpr, RMS_UNROLL: tl.constexpr,
              FOLD: tl.constexpr, SUMS: tl.constexpr = 0, SUMS_BLOCK: tl.constexpr = 1,
              OUT_SUMS: tl.constexpr = False, STAGED_ROWS: tl.constexpr = 0,
              ROTATE: tl.constexpr = 0):
    """out[:, n0:n1] = [res[:, n0:n1] +] [RMSNorm](x) @ W[n0:n1]^T (n1 - n0 <= BLOCK_N); the
    norm's RMS from x, or (SUMS > 0: x scaled by the norm's weight already) from the sums of
    squares ss [SUMS, B] of x's rows, applied to the product. OUT_SUMS: what the next op's norm
    (weight onw) takes of out's columns too, as column group g (``store_norm_inputs`` into os,
    osc). STAGE > 0: rows n0 .. n0 + STAGED_ROWS of W whole in shared memory, the worker's
    staged copy number ``copy`` (``linear_stage``)."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    IN_LOOP: tl.constexpr = HAS_NORM and SUMS == 0
    rows = tl.arange(0, BLOCK_B)
    ns = n0 + tl.arange(0, BLOCK_N)
    r = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    if HAS_RES:  # requested before the weights stream, so its latency hides behind them
        r = tl.load(res_ptr + rows[:, None] * N + ns[None, :],
                    mask=(rows[:, None] < B) & (ns[None, :] < n1), other=0.0).to(tl.float32)
    w = 1.0
    if OUT_SUMS:  # the next norm's weight, asked for before the weights stream too
        w = tl.load(onw_ptr + ns, mask=ns < n1, other=0.0).to(tl.float32)          # [BLOCK_N]
    rstd, ss = first_rstd(x_ptr, eps, B, K, BLOCK_B, BLOCK_R, RMS_UNROLL, HAS_NORM, ss_ptr,
                          SUMS, SUMS_BLOCK)
    y = _round(rows_after(matmul_tile(x_ptr, nw_ptr, rstd, w_ptr, n0, n1 - n0, 0, B, K, IN_LOOP,
                                      BLOCK_B, BLOCK_N, BLOCK_N, BLOCK_K, DT, FORM, STAGES,
                                      FOLD, 0, 0, copy, STAGE, STAGED_ROWS, ROTATE), ss,
                                      eps, K, SUMS), DT)
    if HAS_RES:
        y = r + y
    store_rows(out_ptr, y.to(DT), n0, n1, B, N, BLOCK_B, BLOCK_N)
    if OUT_SUMS:
        y = tl.where((rows[:, None] < B) & (ns[None, :] < n1), y.to(DT).to(tl.float32), 0.0)
        store_norm_inputs(os_ptr, osc_ptr, y, w, g, n0, n1, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def linear_stage(x_ptr, w_ptr, nw_ptr, res_ptr, out_ptr, ss_ptr, os_ptr, onw_ptr, osc_ptr, n0,
                 n1, g, copy, STAGE: tl.constexpr, eps: tl.constexpr, B: tl.constexpr,
                 K: tl.constexpr, N: tl.constexpr, HAS_NORM: tl.constexpr,
                 HAS_RES: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, FORM: tl.constexpr,
                 STAGES: tl.constexpr, RMS_UNROLL: tl.constexpr, FOLD: tl.constexpr,
                 SUMS: tl.constexpr = 0, SUMS_BLOCK: tl.constexpr = 1,
                 OUT_SUMS: tl.constexpr = False, STAGED_ROWS: tl.constexpr = 0,
                 ROTATE: tl.constexpr = 0):
    """``linear_op``'s weights into shared memory before its waits (GPU, a kernel with STAGE
    bytes of staging): rows n0 .. n0 + STAGED_ROWS of W; returns 1 if it started a copy."""
    return staging.issue_rows(w_ptr + n0.to(tl.int64) * K, n1 - n0, K, STAGED_ROWS, STAGE)


@triton.jit
def gate_up_op(x_ptr, nw_ptr, wg_ptr, wu_ptr, out_ptr, ss_ptr, n0, n1, copy,
               STAGE: tl.constexpr, eps: tl.constexpr, B: tl.constexpr, K: tl.constexpr,
               N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, FORM: tl.constexpr,
               STAGES: tl.constexpr, RMS_UNROLL: tl.constexpr, FOLD: tl.constexpr,
               HAS_NORM: tl.constexpr = 1, SUMS: tl.constexpr = 0, SUMS_BLOCK: tl.constexpr = 1,
               STAGED_ROWS: tl.constexpr = 0, ROTATE: tl.constexpr = 0):
    """out[:, n0:n1] = SiLU([norm](x) @ Wg[n0:n1]^T) * ([norm](x) @ Wu[n0:n1]^T), both
    projections from one pipeline as matmul_tile runs it; the norm's RMS as ``linear_op``
    takes it. STAGE > 0: rows n0 .. n0 + STAGED_ROWS of both whole in shared memory, the
    worker's staged copy number ``copy`` (``gate_up_stage``)."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    IN_LOOP: tl.constexpr = HAS_NORM and SUMS == 0
    SR: tl.constexpr = STAGED_ROWS if STAGE > 0 else 0
    rstd, ss = first_rstd(x_ptr, eps, B, K, BLOCK_B, BLOCK_R, RMS_UNROLL, HAS_NORM, ss_ptr,
                          SUMS, SUMS_BLOCK)
    rs = fold_rows(rstd, FOLD, BLOCK_B)
    g = _acc0(FOLD * BLOCK_B, FOLD * BLOCK_N, FORM)
    u = _acc0(FOLD * BLOCK_B, FOLD * BLOCK_N, FORM)
    if SR < BLOCK_N:
        rot = first_step(n0, n1 - n0, K, BLOCK_K, ROTATE)
        for i in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            k0 = loop_column(i, rot, K, BLOCK_K, ROTATE)
            a = load_normed(x_ptr, nw_ptr, rs, k0, B, K, IN_LOOP, BLOCK_B, BLOCK_K, DT, FOLD)
            # each weight's chunk loaded just before its use (both loads first: batch-32 stack
            # 352 bytes instead of 136 on sm_90)
            wg = load_w(wg_ptr, n0, n1 - n0, 0, k0, K, BLOCK_N, BLOCK_N, BLOCK_K, FOLD, SKIP=SR)
            g = _mac(a, wg.to(DT), g, FORM, DT)
            wu = load_w(wu_ptr, n0, n1 - n0, 0, k0, K, BLOCK_N, BLOCK_N, BLOCK_K, FOLD, SKIP=SR)
            u = _mac(a, wu.to(DT), u, FORM, DT)
    g = unfold(g, FORM, FOLD, BLOCK_B, BLOCK_N)
    u = unfold(u, FORM, FOLD, BLOCK_B, BLOCK_N)
    if SR > 0:          # Wg's rows, then Wu's from row SR of the area
        WT: tl.constexpr = wg_ptr.dtype.element_ty
        staging.ready(copy, STAGE)
        sg = staging.rows_at(wg_ptr + n0.to(tl.int64) * K, 0, K, STAGE)
        su = staging.rows_at(wu_ptr + n0.to(tl.int64) * K, SR, K, STAGE)
        g += staged_product(x_ptr, nw_ptr, rstd, sg, n1 - n0, B, K, IN_LOOP, BLOCK_B, BLOCK_N,
                            DT, WT, SR, STAGE)
        u += staged_product(x_ptr, nw_ptr, rstd, su, n1 - n0, B, K, IN_LOOP, BLOCK_B, BLOCK_N,
                            DT, WT, SR, STAGE)
    g = _round(rows_after(g, ss, eps, K, SUMS), DT)
    act = _round(g / (1.0 + tl.exp(-g)), DT)
    u = _round(rows_after(u, ss, eps, K, SUMS), DT)
    store_rows(out_ptr, (act * u).to(DT), n0, n1, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def gate_up_stage(x_ptr, nw_ptr, wg_ptr, wu_ptr, out_ptr, ss_ptr, n0, n1, copy,
                  STAGE: tl.constexpr, eps: tl.constexpr, B: tl.constexpr, K: tl.constexpr,
                  N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, FORM: tl.constexpr,
                  STAGES: tl.constexpr, RMS_UNROLL: tl.constexpr, FOLD: tl.constexpr,
                  HAS_NORM: tl.constexpr = 1, SUMS: tl.constexpr = 0,
                  SUMS_BLOCK: tl.constexpr = 1, STAGED_ROWS: tl.constexpr = 0,
                  ROTATE: tl.constexpr = 0):
    """``gate_up_op``'s weights into shared memory before its waits (as ``linear_stage``): rows
    n0 .. n0 + STAGED_ROWS of Wg, then of Wu from row STAGED_ROWS of the area."""
    staging.issue_rows(wg_ptr + n0.to(tl.int64) * K, n1 - n0, K, STAGED_ROWS, STAGE, 0, 2)
    return staging.issue_rows(wu_ptr + n0.to(tl.int64) * K, n1 - n0, K, STAGED_ROWS, STAGE,
                              STAGED_ROWS, 0)


@triton.jit
def qkv_rope_op(x_ptr, nw_ptr, w_ptr, hn_ptr, inv_ptr, pos_ptr, bt_ptr, out_ptr, cache_ptr,
                ss_ptr, kind, head, layer, d0, col, eps: tl.constexpr, qk_eps: tl.constexpr,
                B: tl.constexpr, K: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr,
                HKV: tl.constexpr, S: tl.constexpr, BS: tl.constexpr,
                HAS_HEAD_NORM: tl.constexpr, BLOCK_B: tl.constexpr, PART: tl.constexpr,
                HALF: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                FORM: tl.constexpr, STAGES: tl.constexpr, RAW: tl.constexpr,
                OUT_COLS: tl.constexpr, RMS_UNROLL: tl.constexpr, FOLD: tl.constexpr,
                HAS_NORM: tl.constexpr = 1, CROSS: tl.constexpr = 0, SUMS: tl.constexpr = 0,
                SUMS_BLOCK: tl.constexpr = 1, ROTATE: tl.constexpr = 0):
    """Dims [d0, d0 + PART) of each half of one head of Q (kind 0), K (1) or V (2) (RoPE pairs
    dim i with i + D/2, so a piece rotates on its own): norm(x) @ W[rows]^T, then for Q and K the
    head RMSNorm (whole heads only) and RoPE at each row's position; Q goes to out [B, OUT_COLS]
    from column ``col``, K and V into the cache. RAW: the projection alone goes to out (a
    head_norm_rope task finishes the head). CROSS (no head norm): PART pairs from pair d0 of
    ``head`` on, the kind's pairs laid end to end over its heads (the last piece fewer). The
    norm's RMS as ``linear_op`` takes it."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    D2: tl.constexpr = D // 2
    IN_LOOP: tl.constexpr = HAS_NORM and SUMS == 0
    if CROSS:
        pairs = tl.where(kind == 0, HQ * D2, HKV * D2) - head * D2 - d0     # left from d0 on
        end = tl.minimum(pairs, PART)
    else:
        end = tl.minimum(d0 + PART, D2) - d0                              # dims in this piece
    if not RAW:
        pos, block, inv = rope_inputs(pos_ptr, bt_ptr, inv_ptr, d0 + tl.arange(0, HALF), end, B,
                                      D, S, BS, BLOCK_B)
    rstd, ss = first_rstd(x_ptr, eps, B, K, BLOCK_B, BLOCK_R, RMS_UNROLL, HAS_NORM, ss_ptr,
                          SUMS, SUMS_BLOCK)
    if CROSS:
        both = _round(rows_after(matmul_tile(x_ptr, nw_ptr, rstd, w_ptr, head * D2 + d0, end,
                                             D2, B, K, IN_LOOP, BLOCK_B, 2 * HALF, HALF, BLOCK_K,
                                             DT, FORM, STAGES, FOLD, 0, D, ROTATE=ROTATE), ss,
                                 eps, K, SUMS), DT)
    else:
        # rows of both halves in one pipeline
        both = _round(rows_after(matmul_tile(x_ptr, nw_ptr, rstd, w_ptr, head * D + d0, end,
                                             D2, B, K, IN_LOOP, BLOCK_B, 2 * HALF, HALF, BLOCK_K,
                                             DT, FORM, STAGES, FOLD, ROTATE=ROTATE), ss, eps,
                                 K, SUMS), DT)
    lo, hi = tl.split(tl.permute(tl.reshape(both, [BLOCK_B, 2, HALF]), [0, 2, 1]))  # [BB, HALF]
    if RAW:
        rows = tl.arange(0, BLOCK_B)
        ds = tl.arange(0, HALF)
        offs = rows[:, None] * OUT_COLS + col + d0 + ds[None, :]
        _store_halves(out_ptr, offs, lo, hi, (rows[:, None] < B) & (ds[None, :] < end), D2)
    elif CROSS:
        cross_rope_store(lo, hi, inv, pos, block, out_ptr, cache_ptr, kind, head, layer, col, d0,
                         end, B, D, HKV, S, BS, BLOCK_B, HALF, OUT_COLS)
    else:
        norm_rope_store(lo, hi, hn_ptr, inv, pos, block, out_ptr, cache_ptr, kind, head, layer,
                        col, d0, end, qk_eps, B, D, HQ, HKV, S, BS, HAS_HEAD_NORM, BLOCK_B, HALF,
                        OUT_COLS)


@triton.jit
def head_norm_rope_op(raw_ptr, hn_ptr, inv_ptr, pos_ptr, bt_ptr, q_ptr, cache_ptr, kind, head,
                      layer, col, qk_eps: tl.constexpr, B: tl.constexpr, D: tl.constexpr,
                      HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, BS: tl.constexpr,
                      RAW_COLS: tl.constexpr, BLOCK_B: tl.constexpr, HALF: tl.constexpr):
    """One whole Q (kind 0) or K (1) head from its raw projection raw[:, col:col + D]: head
    RMSNorm, RoPE, then into q [B, HQ * D] or the cache, as qkv_rope_op does for a whole head."""
    D2: tl.constexpr = D // 2
    rows = tl.arange(0, BLOCK_B)
    ds = tl.arange(0, HALF)
    pos, block, inv = rope_inputs(pos_ptr, bt_ptr, inv_ptr, ds, D2, B, D, S, BS, BLOCK_B)
    mask = (rows[:, None] < B) & (ds[None, :] < D2)
    offs = rows[:, None] * RAW_COLS + col + ds[None, :]
    lo = tl.load(raw_ptr + offs, mask=mask, other=0.0).to(tl.float32)            # [BB, HALF]
    hi = tl.load(raw_ptr + offs + D2, mask=mask, other=0.0).to(tl.float32)
    norm_rope_store(lo, hi, hn_ptr, inv, pos, block, q_ptr, cache_ptr, kind, head, layer,
                    head * D, 0, D2, qk_eps, B, D, HQ, HKV, S, BS, True, BLOCK_B, HALF, HQ * D)
