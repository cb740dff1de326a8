"""Split-K projection op bodies (``@triton.jit``, one tile task each): a task multiplies one K
slice of the activation by the same slice of a column group of W into fp32 partial sums, and
one reduce task per column group adds the slices (and the residual) into the output, or, where
the next op normalises that output first, one per group of whole rows also writes its
RMSNorm.

Or (``fuse_reduce``) no reduce task: each slice takes its column group's ticket after writing
its partial, and the last of the group to take it reduces the group as linear_reduce would.
A q/k/v piece in K slices (``qkv_part_rope_op``) is finished the same way: the last slice to
take the piece's ticket sums the partials, then rotates and stores the piece.

Partials are fp32 [S, B, N] (S slices); activations row-major [B, K] as in ``ops``. The sum
runs over the slices in order, rounded to the model dtype once, as the unsplit ``linear_op``
rounds its product.
"""
import triton
import triton.language as tl

from .attention_ops import last_ticket
from .norm_ops import first_rstd, rows_after, store_normed
from .ops import _round, matmul_tile, store_norm_inputs, store_rows
from .rope_ops import norm_rope_store, rope_inputs


@triton.jit
def linear_part_op(x_ptr, w_ptr, part_ptr, n0, n1, k0, s, B: tl.constexpr, K: tl.constexpr,
                   KS: tl.constexpr, N: tl.constexpr, BLOCK_B: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FORM: tl.constexpr,
                   STAGES: tl.constexpr, FOLD: tl.constexpr, ROTATE: tl.constexpr = 0):
    """part[s, :, n0:n1] = x[:, k0:k0+KS] @ W[n0:n1, k0:k0+KS]^T in fp32 (n1 - n0 <= BLOCK_N);
    ROTATE: as ``ops.matmul_tile``'s."""
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rstd = tl.zeros([BLOCK_B], tl.float32)
    acc = matmul_tile(x_ptr + k0, x_ptr, rstd, w_ptr + k0, n0, n1 - n0, 0, B, K, False, BLOCK_B,
                      BLOCK_N, BLOCK_N, BLOCK_K, DT, FORM, STAGES, FOLD, KS,
                      ROTATE=ROTATE)                                              # [BB, BN]
    store_rows(part_ptr + s * B * N, acc, n0, n1, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def sum_slices(part_ptr, res_ptr, offs, mask, S: tl.constexpr, B: tl.constexpr, N: tl.constexpr,
               HAS_RES: tl.constexpr, DT: tl.constexpr):
    """[res +] round(sum over s of part[s]) at ``offs`` of a [B, N] matrix, each sum rounded to
    DT as eager rounds a projection and then its residual add (fp32 values)."""
    y = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, S):
        y += tl.load(part_ptr + s * B * N + offs, mask=mask, other=0.0)
    y = _round(y, DT)
    if HAS_RES:
        y = _round(tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32) + y, DT)
    return y


@triton.jit
def linear_reduce_op(part_ptr, res_ptr, out_ptr, ss_ptr, nw_ptr, sc_ptr, n0, n1,
                     S: tl.constexpr, B: tl.constexpr, N: tl.constexpr, HAS_RES: tl.constexpr,
                     BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, SUMS: tl.constexpr = False):
    """out[:, n0:n1] = [res[:, n0:n1] +] round(sum over s of part[s, :, n0:n1]); SUMS: what
    the next op's norm (weight nw) takes of those columns too (``ops.store_norm_inputs``)."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_B)
    ns = n0 + tl.arange(0, BLOCK_N)
    offs = rows[:, None] * N + ns[None, :]
    mask = (rows[:, None] < B) & (ns[None, :] < n1)
    w = 1.0
    if SUMS:  # asked for first: its latency (a weight, from HBM) hides behind the partials'
        w = tl.load(nw_ptr + ns, mask=ns < n1, other=0.0).to(tl.float32)          # [BLOCK_N]
    y = sum_slices(part_ptr, res_ptr, offs, mask, S, B, N, HAS_RES, DT)
    store_rows(out_ptr, y.to(DT), n0, n1, B, N, BLOCK_B, BLOCK_N)
    if SUMS:
        store_norm_inputs(ss_ptr, sc_ptr, y, w, n0 // BLOCK_N, n0, n1, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def linear_part_reduce_op(x_ptr, w_ptr, part_ptr, res_ptr, out_ptr, ss_ptr, nw_ptr, sc_ptr, n0,
                          n1, k0, s, counters_ptr, epoch, ticket, B: tl.constexpr,
                          K: tl.constexpr, KS: tl.constexpr, N: tl.constexpr,
                          BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          FORM: tl.constexpr, STAGES: tl.constexpr, FOLD: tl.constexpr,
                          S: tl.constexpr, HAS_RES: tl.constexpr, RED_ROWS: tl.constexpr,
                          SUMS: tl.constexpr, ROTATE: tl.constexpr = 0):
    """``linear_part_op`` into slot s of part, then the group's ticket (S slices a launch): the
    slice that takes its last is ``linear_reduce_op`` of columns [n0, n1) (RED_ROWS rows a
    block), the slices summed in order whichever it is."""
    linear_part_op(x_ptr, w_ptr, part_ptr, n0, n1, k0, s, B, K, KS, N, BLOCK_B, BLOCK_N,
                   BLOCK_K, FORM, STAGES, FOLD, ROTATE)
    if last_ticket(counters_ptr + ticket, S, epoch):
        linear_reduce_op(part_ptr, res_ptr, out_ptr, ss_ptr, nw_ptr, sc_ptr, n0, n1, S, B, N,
                         HAS_RES, RED_ROWS, BLOCK_N, SUMS)


@triton.jit
def reduce_norm_op(part_ptr, res_ptr, nw_ptr, out_ptr, xn_ptr, r0, r1, eps: tl.constexpr,
                   S: tl.constexpr, B: tl.constexpr, N: tl.constexpr, HAS_RES: tl.constexpr,
                   ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows [r0, r1) (r1 - r0 <= ROWS, N <= BLOCK_N): out = [res +] round(sum over s of part[s])
    as ``linear_reduce_op`` adds it, and xn = RMSNorm(out) * w as ``norm_ops.rms_norm_op``
    normalises it."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    rows = r0 + tl.arange(0, ROWS)
    ns = tl.arange(0, BLOCK_N)
    offs = rows[:, None] * N + ns[None, :]                                  # [ROWS, BLOCK_N]
    mask = (rows[:, None] < r1) & (ns[None, :] < N)
    y = sum_slices(part_ptr, res_ptr, offs, mask, S, B, N, HAS_RES, DT)
    tl.store(out_ptr + offs, y.to(DT), mask=mask)
    store_normed(xn_ptr, offs, mask, y, nw_ptr, ns, N, eps, DT)


@triton.jit
def piece_slots(head, d0, end, cols, D: tl.constexpr, B: tl.constexpr, BLOCK_B: tl.constexpr,
                HALF: tl.constexpr):
    """Offsets [BLOCK_B, 2 * HALF] of a q/k/v piece's product (dims [d0, d0 + end) of each
    half of ``head``, as ``matmul_tile`` gives it: the lo half's, then the hi half's) in one
    slot [B, cols] of its kind's partials (columns as the weight's rows), and their mask."""
    rows = tl.arange(0, BLOCK_B)
    js = tl.arange(0, 2 * HALF)
    dims = head * D + d0 + js // HALF * (D // 2) + js % HALF
    return rows[:, None] * cols + dims[None, :], (rows[:, None] < B) & (js % HALF < end)[None, :]


@triton.jit
def qkv_part_rope_op(x_ptr, w_ptr, hn_ptr, inv_ptr, pos_ptr, bt_ptr, out_ptr, cache_ptr, ss_ptr,
                     part_ptr, kind, head, layer, d0, s, counters_ptr, epoch, ticket,
                     eps: tl.constexpr, qk_eps: tl.constexpr, B: tl.constexpr,
                     K: tl.constexpr, KS: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr,
                     HKV: tl.constexpr, S: tl.constexpr, BS: tl.constexpr,
                     HAS_HEAD_NORM: tl.constexpr, BLOCK_B: tl.constexpr, PART: tl.constexpr,
                     HALF: tl.constexpr, BLOCK_K: tl.constexpr, FORM: tl.constexpr,
                     STAGES: tl.constexpr, FOLD: tl.constexpr, SLICES: tl.constexpr,
                     HAS_NORM: tl.constexpr, SUMS: tl.constexpr, SUMS_BLOCK: tl.constexpr,
                     ROTATE: tl.constexpr = 0):
    """K slice s (x's columns [s * KS, (s + 1) * KS), x normalised already or the norm's RMS
    from sums of squares) of ``ops.qkv_rope_op``'s piece within a head: its fp32 product into
    slot s of its kind's part [SLICES, B, heads * D], then the piece's ticket; the slice that
    takes its last sums the slots in order and finishes the piece as qkv_rope_op does (the row
    RMS, the head norm, RoPE, q's columns or the cache)."""
    tl.static_assert(SUMS > 0 or not HAS_NORM, "a norm in the loop needs all of K")
    DT: tl.constexpr = out_ptr.dtype.element_ty
    end = tl.minimum(d0 + PART, D // 2) - d0
    k0 = s * KS
    acc = matmul_tile(x_ptr + k0, x_ptr, tl.zeros([BLOCK_B], tl.float32), w_ptr + k0,
                      head * D + d0, end, D // 2, B, K, False, BLOCK_B, 2 * HALF, HALF, BLOCK_K,
                      DT, FORM, STAGES, FOLD, KS, ROTATE=ROTATE)              # [BB, 2 HALF]
    cols = tl.where(kind == 0, HQ, HKV) * D
    offs, mask = piece_slots(head, d0, end, cols, D, B, BLOCK_B, HALF)
    slot = cols * B
    tl.store(part_ptr + s * slot + offs, acc, mask=mask)
    if last_ticket(counters_ptr + ticket, SLICES, epoch):
        pos, block, inv = rope_inputs(pos_ptr, bt_ptr, inv_ptr, d0 + tl.arange(0, HALF), end,
                                      B, D, S, BS, BLOCK_B)
        _, ss = first_rstd(x_ptr, eps, B, K, BLOCK_B, BLOCK_K, 0, HAS_NORM, ss_ptr, SUMS,
                           SUMS_BLOCK)
        y = tl.load(part_ptr + offs, mask=mask, other=0.0)
        for i in tl.static_range(1, SLICES):
            y += tl.load(part_ptr + i * slot + offs, mask=mask, other=0.0)
        both = _round(rows_after(y, ss, eps, K, SUMS), DT)
        lo, hi = tl.split(tl.permute(tl.reshape(both, [BLOCK_B, 2, HALF]), [0, 2, 1]))
        norm_rope_store(lo, hi, hn_ptr, inv, pos, block, out_ptr, cache_ptr, kind, head, layer,
                        head * D, d0, end, qk_eps, B, D, HQ, HKV, S, BS, HAS_HEAD_NORM, BLOCK_B,
                        HALF, HQ * D)
