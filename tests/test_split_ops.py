"""The split-K reduce bodies on their own: ``reduce_norm_op`` (the K slices' partials summed by
whole rows, the residual added, the rows normalised) and ``linear_reduce_op`` with the sums of
squares of its column group's rows and its columns scaled by the next norm's weight, against
PyTorch in fp32, what lies outside untouched. On the
CPU through the Triton interpreter (on a GPU, on the GPU)."""
import pytest
import torch
import triton
import triton.language as tl

from megakernel.compiler import split_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
S, B, N, EPS = 3, 5, 48, 1e-5                      # N not a power of two: masked columns


@triton.jit
def reduce_norm_kernel(part_ptr, res_ptr, nw_ptr, out_ptr, xn_ptr, r0, r1, S: tl.constexpr,
                       B: tl.constexpr, N: tl.constexpr, HAS_RES: tl.constexpr,
                       ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    split_ops.reduce_norm_op(part_ptr, res_ptr, nw_ptr, out_ptr, xn_ptr, r0, r1, 1e-5, S, B, N,
                             HAS_RES, ROWS, BLOCK_N)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("r0,r1", [(0, B), (1, 4)])
def test_reduce_norm_sums_the_slices_and_normalises_its_rows(residual, r0, r1):
    gen = torch.Generator().manual_seed(10 * r0 + r1 + residual)
    part = torch.randn(S, B, N, generator=gen)                               # [S, B, N]
    res = torch.randn(B, N, generator=gen)
    nw = torch.randn(N, generator=gen)
    out = torch.full((B, N), float("nan"))
    xn = torch.full((B, N), float("nan"))
    args = [t.to(DEVICE) for t in (part, res, nw, out, xn)]
    reduce_norm_kernel[(1,)](*args, r0, r1, S, B, N, residual, 8, 64)
    y = part.sum(0) + (res if residual else 0)                               # [B, N]
    ref = nw * y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + EPS)
    got_out, got_xn = args[3].cpu(), args[4].cpu()
    torch.testing.assert_close(got_out[r0:r1], y[r0:r1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_xn[r0:r1], ref[r0:r1], atol=1e-5, rtol=1e-5)
    outside = torch.ones(B, dtype=torch.bool)
    outside[r0:r1] = False
    assert got_out[outside].isnan().all() and got_xn[outside].isnan().all()


@triton.jit
def reduce_sums_kernel(part_ptr, res_ptr, out_ptr, ss_ptr, nw_ptr, sc_ptr, n0, n1,
                       S: tl.constexpr, B: tl.constexpr, N: tl.constexpr, BLOCK_B: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    split_ops.linear_reduce_op(part_ptr, res_ptr, out_ptr, ss_ptr, nw_ptr, sc_ptr, n0, n1, S, B,
                               N, True, BLOCK_B, BLOCK_N, True)


@pytest.mark.parametrize("group", [0, 1])
def test_linear_reduce_writes_its_column_groups_sums_of_squares(group):
    """Column group ``group`` of 32 columns (the last, 1, holds 16 of N = 48: masked)."""
    gen = torch.Generator().manual_seed(group)
    part, res = torch.randn(S, B, N, generator=gen), torch.randn(B, N, generator=gen)
    nw = torch.randn(N, generator=gen)
    out, ss = torch.full((B, N), float("nan")), torch.full((2, B), float("nan"))     # [G, B]
    args = [t.to(DEVICE) for t in (part, res, out, ss, nw, torch.full((B, N), float("nan")))]
    n0, n1 = 32 * group, min(N, 32 * group + 32)
    reduce_sums_kernel[(1,)](*args, n0, n1, S, B, N, 8, 32)
    y = part.sum(0)[:, n0:n1] + res[:, n0:n1]                                 # [B, n1 - n0]
    got_out, got_ss, got_sc = args[2].cpu(), args[3].cpu(), args[5].cpu()
    torch.testing.assert_close(got_out[:, n0:n1], y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_ss[group], y.pow(2).sum(-1), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(got_sc[:, n0:n1], y * nw[n0:n1], atol=1e-5, rtol=1e-5)
    assert got_ss[1 - group].isnan().all() and got_out[:, :n0].isnan().all()
    assert got_sc[:, :n0].isnan().all() and got_sc[:, n1:].isnan().all()
