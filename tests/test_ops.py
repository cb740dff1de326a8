"""The projection op body on its own: ``ops.matmul_tile`` against PyTorch in fp32, for every fold
of a step's columns, with and without the RMSNorm prologue, and with the two-halves row map of
a q/k/v piece; with a task's first rows staged (``staging``, read in place under the
interpreter) against the same tile streamed; the RMS from sums of squares applied after it.
On the CPU through the Triton interpreter (on a GPU, on the GPU)."""
import pytest
import torch
import triton
import triton.language as tl

from megakernel.compiler import norm_ops, ops
from megakernel.compiler.cost import STAGE_IN_PLACE

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def tile_kernel(x_ptr, nw_ptr, w_ptr, y_ptr, base, end, STRIDE: tl.constexpr, B: tl.constexpr,
                K: tl.constexpr, NORM: tl.constexpr, BLOCK_B: tl.constexpr,
                BLOCK_N: tl.constexpr, HALF: tl.constexpr, BLOCK_K: tl.constexpr,
                FOLD: tl.constexpr, BF16: tl.constexpr = False, STAGE: tl.constexpr = 0,
                SR: tl.constexpr = 0):
    """fp32 tensor-core form, or (BF16) the bf16 multiply-and-sum with SR rows staged."""
    rstd = tl.zeros([BLOCK_B], tl.float32)
    if NORM:
        rstd = ops.row_rstd(x_ptr, 1e-5, B, K, BLOCK_B, BLOCK_K)
    acc = ops.matmul_tile(x_ptr, nw_ptr, rstd, w_ptr, base, end, STRIDE, B, K, NORM, BLOCK_B,
                          BLOCK_N, HALF, BLOCK_K, tl.bfloat16 if BF16 else tl.float32,
                          1 if BF16 else 0, 1, FOLD, copy=0, STAGE=STAGE,
                          STAGED_ROWS=SR)                                    # [BB, BN]
    rows, cols = tl.arange(0, BLOCK_B), tl.arange(0, BLOCK_N)
    tl.store(y_ptr + rows[:, None] * BLOCK_N + cols[None, :], acc, mask=rows[:, None] < B)


def reference(x, nw, w, rows, norm):
    if norm:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * nw
    return x @ w[rows].T                                                     # [B, len(rows)]


@pytest.mark.parametrize("fold", [1, 2, 4, 16])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("halves", [False, True])
def test_matmul_tile_every_fold_equals_torch(fold, norm, halves):
    gen = torch.Generator().manual_seed(fold + 2 * norm + 4 * halves)
    batch, n, k, bk, bn = 3, 40, 600, 256, 16         # K not a multiple of the step: masked
    block_b = max(4, 16 // fold)                       # rows per fold, 16 over the folds
    x, nw, w = (torch.randn(*s, generator=gen) for s in ((batch, k), (k,), (n, k)))
    if halves:      # q/k/v piece: dims [2, 2 + 6) of each half of a 24-dim head from row 8
        base, end, stride, half = 8 + 2, 6, 12, bn // 2
        rows = [base + j % half + (j // half) * stride for j in range(bn)]
        valid = [j % half < end for j in range(bn)]
    else:
        base, end, stride, half = 20, 13, 0, bn
        rows, valid = [base + j for j in range(bn)], [j < end for j in range(bn)]
    y = torch.full((block_b, bn), float("nan"))
    args = [t.to(DEVICE) for t in (x, nw, w, y)]
    tile_kernel[(1,)](*args, base, end, stride, batch, k, norm, block_b, bn, half, bk, fold)
    out = args[3].cpu()[:batch]
    ref = reference(x, nw, w, [r if v else 0 for r, v in zip(rows, valid)], norm)
    ref[:, [not v for v in valid]] = 0.0                                     # rows past end
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(DEVICE == "cuda", reason="rows read in place: the interpreter's staging")
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("end,sr", [(13, 4), (3, 8), (16, 16)])
def test_staged_rows_give_the_streamed_tile(norm, end, sr):
    """The first ``sr`` rows of a bf16 tile from the staged read (word by word), the others from
    the streamed loop that skips them: the tile the loop alone gives, to fp32 rounding, rows
    past ``end`` 0; both near torch's (the interpreter truncates where torch rounds)."""
    gen = torch.Generator().manual_seed(end + sr + norm)
    batch, n, k, bk, bn = 3, 40, 256, 64, 16         # sr 16: no rows streamed
    x, nw, w = (torch.randn(*s, generator=gen).to(torch.bfloat16)
                for s in ((batch, k), (k,), (n, k)))
    outs = []
    for stage, rows in ((0, 0), (STAGE_IN_PLACE, sr)):
        y = torch.full((4, bn), float("nan"))
        tile_kernel[(1,)](x, nw, w, y, 20, end, 0, batch, k, norm, 4, bn, bn, bk, 1, True,
                          stage, rows)
        outs.append(y[:batch])
    streamed, staged = outs
    assert torch.isfinite(staged).all() and (staged[:, end:] == 0).all()
    torch.testing.assert_close(staged, streamed, atol=1e-5, rtol=1e-5)
    ref = reference(x.float(), nw.float(), w.float(), range(20, 20 + bn), norm)
    ref[:, end:] = 0.0
    assert ((staged - ref).norm() / ref.norm()).item() < 2e-2


@triton.jit
def sums_kernel(ss_ptr, y_ptr, out_ptr, G: tl.constexpr, B: tl.constexpr, K: tl.constexpr,
                BLOCK_B: tl.constexpr, GB: tl.constexpr, N: tl.constexpr):
    """y [B, N] scaled by the RMS of rows whose sums of squares are ss [G, B] (over K)."""
    _, ss = norm_ops.first_rstd(ss_ptr, 1e-5, B, K, BLOCK_B, 16, 0, True, ss_ptr, G, GB)
    rows, ns = tl.arange(0, BLOCK_B), tl.arange(0, N)
    offs, mask = rows[:, None] * N + ns[None, :], rows[:, None] < B
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, norm_ops.rows_after(y, ss, 1e-5, K, G), mask=mask)


@pytest.mark.parametrize("groups,batch", [(5, 3), (40, 20)])
def test_the_rms_from_sums_of_squares_held_through_the_loop_or_reduced_before_it(groups, batch):
    """5 groups x 3 rows (a block of 8 x 4: the sums held, reduced after the product) and 40 x
    20 (64 x 32, above ``DEFER_SUMS``: reduced before) give the same RMS."""
    gb, bb, k, n = triton.next_power_of_2(groups), triton.next_power_of_2(batch), 96, 16
    assert (gb * bb > norm_ops.DEFER_SUMS.value) == (groups == 40)
    gen = torch.Generator().manual_seed(groups)
    ss, y = torch.rand(groups, batch, generator=gen), torch.randn(batch, n, generator=gen)
    out = torch.full((batch, n), float("nan"))
    args = [t.to(DEVICE) for t in (ss, y, out)]
    sums_kernel[(1,)](*args, groups, batch, k, bb, gb, n)
    ref = y * torch.rsqrt(ss.sum(0) / k + 1e-5)[:, None]
    torch.testing.assert_close(args[2].cpu(), ref, atol=1e-5, rtol=1e-5)
