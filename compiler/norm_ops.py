"""RMSNorm in the megakernel (``@triton.jit``): pieces of the projection bodies, a row's RMS in
one pass over x (``row_rstd``) or from sums of squares (``first_rstd``), the normalised input of
one projection step (``load_normed``) or the RMS applied to its product (``rows_after``); and the
op body of norm first, whole rows normalised once (``rms_norm_op``).

x is row-major [B, K]; a folded step ([FOLD * BLOCK_B, BLOCK_K / FOLD], see ``ops.matmul_tile``)
holds row b's q-th slice of the step's columns in row q * BLOCK_B + b. Rounding follows eager
PyTorch as in ``ops``.
"""
import triton
import triton.language as tl


@triton.jit
def _round(x, DT: tl.constexpr):
    """Round fp32 to the model dtype and back, as a materialised eager tensor would be."""
    return x.to(DT).to(tl.float32)


# the most sums of squares (groups x rows) a projection holds through its loop (``first_rstd``)
DEFER_SUMS = tl.constexpr(1024)


@triton.jit
def row_rstd(x_ptr, eps, B: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
             BLOCK_K: tl.constexpr, UNROLL: tl.constexpr = 16384):
    """1 / sqrt(mean(x^2) + eps) per row of x [B, K] -> [BLOCK_B] fp32. Up to UNROLL elements of
    real rows, the steps are unrolled and their squares reduced once at the end, so that every
    load is in flight at once: one memory latency and one block-wide reduction, where a
    reduction per step cost a latency and barriers each (sm_90 code of llama-3.2-1b at batch 1:
    one reduction instead of four; stack frame 112 bytes instead of 136)."""
    rows = tl.arange(0, BLOCK_B)
    if B * K <= UNROLL:
        acc = tl.zeros([BLOCK_B, BLOCK_K], tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            acc += _squares(x_ptr, rows, k0, B, K, BLOCK_K)
        total = tl.sum(acc, axis=1)
    else:  # larger blocks would hold too many registers at once: a reduction per step
        total = tl.zeros([BLOCK_B], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            total += tl.sum(_squares(x_ptr, rows, k0, B, K, BLOCK_K), axis=1)
    return tl.math.rsqrt(total / K + eps)


@triton.jit
def first_rstd(x_ptr, eps, B: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
               BLOCK_K: tl.constexpr, UNROLL: tl.constexpr, HAS_NORM: tl.constexpr,
               ss_ptr, SUMS: tl.constexpr, SUMS_BLOCK: tl.constexpr):
    """What a projection's norm takes before its loop: (the row RMS from x [BLOCK_B] for a norm
    in the loop (``row_rstd``), else zeros; and (SUMS > 0) the sums of squares of SUMS column
    groups of x's rows, ss [SUMS, B], asked for in one load of [SUMS_BLOCK, BLOCK_B], else
    zeros). Up to DEFER_SUMS elements the sums are only asked for here and reduced after the
    loop (``rows_after``), since their reduction's barriers waited for them before the loop's
    first loads were issued; a larger block is reduced here to [1, BLOCK_B] (held through the
    loop it spilled: sm_90 build of llama-3.2-1b at 64 rows, stack 120 -> 168 bytes)."""
    rstd = tl.zeros([BLOCK_B], tl.float32)
    ss = tl.zeros([SUMS_BLOCK, BLOCK_B], tl.float32)
    if HAS_NORM:
        if SUMS > 0:
            gs = tl.arange(0, SUMS_BLOCK)
            rows = tl.arange(0, BLOCK_B)
            ss = tl.load(ss_ptr + gs[:, None] * B + rows[None, :],
                         mask=(gs[:, None] < SUMS) & (rows[None, :] < B), other=0.0)
            if SUMS_BLOCK * BLOCK_B > DEFER_SUMS:
                ss = tl.sum(ss, axis=0, keep_dims=True)                       # [1, BLOCK_B]
        else:
            rstd = row_rstd(x_ptr, eps, B, K, BLOCK_B, BLOCK_K, UNROLL)
    return rstd, ss


@triton.jit
def rows_after(y, ss, eps, K: tl.constexpr, SUMS: tl.constexpr):
    """A projection's result [BLOCK_B, N] scaled by each row's RMS from the sums of squares ss
    (``first_rstd``) where the norm comes after the product (SUMS > 0: x was scaled by the
    norm's weight already, see ``tile_norm``), else y."""
    if SUMS > 0:
        return y * tl.math.rsqrt(tl.sum(ss, axis=0) / K + eps)[:, None]
    else:
        return y


@triton.jit
def _squares(x_ptr, rows, k0, B: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr):
    ks = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + rows[:, None] * K + ks[None, :],
                mask=(rows[:, None] < B) & (ks[None, :] < K), other=0.0).to(tl.float32)
    return x * x


@triton.jit
def step_index(k0, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr):
    """Row and columns of each element of a projection step [ROWS, BLOCK_K] from column k0:
    rows [ROWS] and columns [1, BLOCK_K]; folded (FOLD > 1), rows [FOLD * ROWS] (element row
    q * ROWS + j is row j) and columns [FOLD * ROWS, BLOCK_K / FOLD] (its q-th slice)."""
    if FOLD == 1:
        return tl.arange(0, ROWS), k0 + tl.arange(0, BLOCK_K)[None, :]
    else:
        KQ: tl.constexpr = BLOCK_K // FOLD
        v = tl.arange(0, FOLD * ROWS)
        return v % ROWS, k0 + (v // ROWS)[:, None] * KQ + tl.arange(0, KQ)[None, :]


@triton.jit
def load_x(x_ptr, nw_ptr, k0, B: tl.constexpr, K: tl.constexpr, HAS_NORM: tl.constexpr,
           BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr = 1,
           KEND: tl.constexpr = 0):
    """Columns [k0, k0 + BLOCK_K) of x -> [BLOCK_B, BLOCK_K] as stored, rows K apart, and of the
    norm weight in fp32 (broadcast over the rows; 1.0 without a norm); none read from KEND on
    (0: K). FOLD > 1: folded, [FOLD * BLOCK_B, BLOCK_K / FOLD], row q * BLOCK_B + b holding row
    b's q-th slice of the columns."""
    LIM: tl.constexpr = KEND if KEND > 0 else K
    rows, ks = step_index(k0, BLOCK_B, BLOCK_K, FOLD)
    x = tl.load(x_ptr + rows[:, None] * K + ks, mask=(rows[:, None] < B) & (ks < LIM), other=0.0)
    w = 1.0
    if HAS_NORM:
        w = tl.load(nw_ptr + ks, mask=ks < LIM, other=0.0).to(tl.float32)
    return x, w


@triton.jit
def load_normed(x_ptr, nw_ptr, rstd, k0, B: tl.constexpr, K: tl.constexpr, HAS_NORM: tl.constexpr,
                BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, DT: tl.constexpr,
                FOLD: tl.constexpr = 1, KEND: tl.constexpr = 0):
    """Columns [k0, k0 + BLOCK_K) of RMSNorm(x) * w (or of x) in DT, as ``load_x`` lays them
    out; ``rstd`` has a value per (folded) row."""
    x, w = load_x(x_ptr, nw_ptr, k0, B, K, HAS_NORM, BLOCK_B, BLOCK_K, FOLD, KEND)
    if HAS_NORM:
        xn = _round(x.to(tl.float32) * rstd[:, None], DT)
        x = (w * xn).to(DT)
    return x.to(DT)


@triton.jit
def rms_norm_op(x_ptr, nw_ptr, out_ptr, r0, r1, eps: tl.constexpr, K: tl.constexpr,
                ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[r0:r1] = RMSNorm(x[r0:r1]) * w for x [B, K], whole rows at once (r1 - r0 <= ROWS,
    K <= BLOCK_K), rounded as ``load_normed`` rounds."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    rows = r0 + tl.arange(0, ROWS)
    ks = tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < r1) & (ks[None, :] < K)
    offs = rows[:, None] * K + ks[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)       # [ROWS, BLOCK_K]
    store_normed(out_ptr, offs, mask, x, nw_ptr, ks, K, eps, DT)


@triton.jit
def store_normed(out_ptr, offs, mask, x, nw_ptr, ks, K: tl.constexpr, eps, DT: tl.constexpr):
    """out[offs] = RMSNorm(x) * w for whole rows x [ROWS, BLOCK_K] in fp32 (columns ``ks``, K
    of them real, the rest 0), rounded as ``load_normed`` rounds."""
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / K + eps)
    w = tl.load(nw_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (w[None, :] * _round(x * rstd[:, None], DT)).to(DT), mask=mask)
