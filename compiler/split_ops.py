"""Split-K projection op bodies (``@triton.jit``, one tile task each): a task multiplies one K
slice of the activation by the same slice of a column group of W into fp32 partial sums, and
one reduce task per column group adds the slices (and the residual) into the output, or, where
the next op normalises that output first, one per group of whole rows also writes its
RMSNorm.

Or (``fuse_reduce``) no reduce task: each slice takes its column group's ticket after writing
its partial, and the last of the group to take it reduces the group as linear_reduce would.

Partials are fp32 [S, B, N] (S slices); activations row-major [B, K] as in ``ops``. The sum
runs over the slices in order, rounded to the model dtype once, as the unsplit ``linear_op``
rounds its product.
"""
import triton
import triton.language as tl

from .attention_ops import last_ticket
from .norm_ops import store_normed
from .ops import _round, matmul_tile, store_norm_inputs, store_rows


@triton.jit
def linear_part_op(x_ptr, w_ptr, part_ptr, n0, n1, k0, s, B: tl.constexpr, K: tl.constexpr,
                   KS: tl.constexpr, N: tl.constexpr, BLOCK_B: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FORM: tl.constexpr,
                   STAGES: tl.constexpr, FOLD: tl.constexpr):
    """part[s, :, n0:n1] = x[:, k0:k0+KS] @ W[n0:n1, k0:k0+KS]^T in fp32 (n1 - n0 <= BLOCK_N)."""
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rstd = tl.zeros([BLOCK_B], tl.float32)
    acc = matmul_tile(x_ptr + k0, x_ptr, rstd, w_ptr + k0, n0, n1 - n0, 0, B, K, False, BLOCK_B,
                      BLOCK_N, BLOCK_N, BLOCK_K, DT, FORM, STAGES, FOLD, KS)      # [BB, BN]
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
                          SUMS: tl.constexpr):
    """``linear_part_op`` into slot s of part, then the group's ticket (S slices a launch): the
    slice that takes its last is ``linear_reduce_op`` of columns [n0, n1) (RED_ROWS rows a
    block), the slices summed in order whichever it is."""
    linear_part_op(x_ptr, w_ptr, part_ptr, n0, n1, k0, s, B, K, KS, N, BLOCK_B, BLOCK_N,
                   BLOCK_K, FORM, STAGES, FOLD)
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
