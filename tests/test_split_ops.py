"""The split-K reduce bodies on their own: ``reduce_norm_op`` (the K slices' partials summed by
whole rows, the residual added, the rows normalised) against PyTorch in fp32, rows outside its
range untouched. On the CPU through the Triton interpreter (on a GPU, on the GPU)."""
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
