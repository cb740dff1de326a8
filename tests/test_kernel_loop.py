"""The persistent loop's waits (``kernel_loop.wait_counters``) under the interpreter: a task's
wait list polled one wait after another (WAITS 1) or all at once (WAITS > 1), met or short;
the staged weights' read (``staging.staged_row``); the offsets a prefetch range asks L2 for."""
import pytest
import torch
import triton
import triton.language as tl

from megakernel.compiler import kernel_loop, staging
from megakernel.compiler.cost import STAGE_IN_PLACE


@triton.jit
def _wait(waits_ptr, counters_ptr, error_ptr, out_ptr, count, epoch, task,
          WAITS: tl.constexpr):
    c0 = tl.load(waits_ptr)
    size0 = tl.load(waits_ptr + 1)
    ok = kernel_loop.wait_counters(waits_ptr, counters_ptr, error_ptr, 0, count, c0, size0,
                                   epoch, 3, task, WAITS=WAITS)
    tl.store(out_ptr, ok.to(tl.int32))


def wait(counters: list[int], waits: list[tuple[int, int]], epoch: int, waits_block: int):
    """(met, error words) of one task waiting on ``waits`` [(counter, size)]."""
    table = torch.tensor(waits, dtype=torch.int32).flatten()
    error = torch.zeros(4, dtype=torch.int32)
    out = torch.full((1,), -1, dtype=torch.int32)
    _wait[(1,)](table, torch.tensor(counters, dtype=torch.int32), error, out, len(waits), epoch,
                7, WAITS=waits_block)
    return bool(out.item()), error.tolist()


@pytest.mark.parametrize("waits_block", [1, 4])
def test_waits_met_or_the_first_short_one_recorded(waits_block):
    waits = [(2, 3), (0, 1), (3, 2)]                  # (counter, producers per epoch)
    assert wait([2, 9, 6, 4], waits, 2, waits_block) == (True, [0, 0, 0, 0])
    # epoch 2: counter 0 needs 2 (has 2), counter 3 needs 4 but has 3, counter 2 has 6 of 6
    assert wait([2, 9, 6, 3], waits, 2, waits_block) == (False, [1, 7, 3, 3])
    # two short: the first in the list is recorded
    assert wait([1, 9, 5, 3], waits, 2, waits_block) == (False, [1, 7, 2, 5])
    assert wait([0, 0, 0, 0], waits[:1], 0, waits_block) == (True, [0, 0, 0, 0])


@triton.jit
def _staged_rows(w_ptr, x_ptr, nw_ptr, out_ptr, rstd, end, R: tl.constexpr, K: tl.constexpr,
                 HAS_NORM: tl.constexpr):
    out = staging.staged_row(x_ptr, nw_ptr, rstd, w_ptr, end, HAS_NORM, R, R, tl.bfloat16,
                             tl.bfloat16, K, STAGE_IN_PLACE)
    tl.store(out_ptr + tl.arange(0, R), out)


@pytest.mark.parametrize("has_norm,k", [(False, 80), (True, 80), (False, 512)])
def test_staged_words_multiply_as_the_rows_they_hold(has_norm, k):
    """The staged read (``staging.staged_row``, rows read in place): its word-wise products
    (two weights a word times the same words of x, normed as ``load_normed`` norms) sum to
    W @ [norm](x), rows from ``end`` on 0; k 80: 10 groups of 8 a row in 16 lanes, 6 masked;
    k 512: two steps of 32 lanes."""
    w = torch.randn(8, k).to(torch.bfloat16)                      # [R, K]
    x, nw, rstd = torch.randn(k).to(torch.bfloat16), torch.rand(k).to(torch.bfloat16), 0.7
    xn = x.float()
    if has_norm:
        xn = (nw.float() * (xn * rstd).to(torch.bfloat16).float()).to(torch.bfloat16).float()
    out = torch.full((8,), float("nan"))
    _staged_rows[(1,)](w, x, nw, out, rstd, 6, 8, k, has_norm)
    ref = w.float() @ xn
    ref[6:] = 0.0
    assert (out[6:] == 0).all()
    # the interpreter truncates fp32 -> bf16 where torch rounds: a swapped half is off by ~1
    assert ((out - ref).norm() / ref.norm()).item() < (2e-2 if has_norm else 1e-6)


@triton.jit
def _offsets(out_ptr, start, row, stride, N: tl.constexpr):
    e = start + tl.arange(0, N).to(tl.int64) * 64
    tl.store(out_ptr + tl.arange(0, N), kernel_loop.range_offsets(e, row, stride))


@pytest.mark.parametrize("start,row,stride,want", [
    (0, 0, 0, [0, 64, 128, 192, 256, 320, 384, 448]),             # contiguous
    (128, 0, 0, [128, 192, 256, 320, 384, 448, 512, 576]),
    (0, 128, 512, [0, 64, 512, 576, 1024, 1088, 1536, 1600]),     # 2 lines of each 512-row
    (64, 192, 2048, [64, 128, 2048, 2112, 2176, 4096, 4160, 4224])])
def test_prefetch_lines_fall_in_the_range_they_name(start, row, stride, want):
    """The element offsets a prefetch asks for (``kernel_loop.range_offsets``, a 64-element
    line each, from line ``start`` / 64 of the range on): for a contiguous range (row 0) every
    line; for a column slice of ``row`` elements of each of a matrix's rows ``stride`` apart,
    each line of the slice in each row, in order."""
    out = torch.full((8,), -1, dtype=torch.int64)
    _offsets[(1,)](out, start, row, stride, N=8)
    assert out.tolist() == want
