"""Weights staged in shared memory (``compiler.staging``) on the GPU: bulk copies armed on the
mbarrier, its phases, and the vector reads back word for word (skipped without CUDA)."""
import pytest
import torch
import triton
import triton.language as tl

from megakernel.compiler import staging
from megakernel.compiler.cost import STAGE_HEAD
from megakernel.runtime.residency import reserve_staging

pytestmark = pytest.mark.gpu


@triton.jit
def _round_trip(src_ptr, out_ptr, info_ptr, ROWS: tl.constexpr, K: tl.constexpr,
                SR: tl.constexpr, ROUNDS: tl.constexpr, STAGE: tl.constexpr):
    staging.init(STAGE)
    W: tl.constexpr = K // 2                                      # 4-byte words a row
    words = tl.arange(0, SR)[:, None] * W + 4 * tl.arange(0, K // 8)[None, :]   # [SR, K / 8]
    for r in range(ROUNDS):             # one copy a round: the barrier's phases in turn
        staging.issue_rows(src_ptr + r * ROWS * K, ROWS, K, SR, STAGE)
        staging.ready(r, STAGE)
        sbase = staging.rows_at(src_ptr + r * ROWS * K, 0, K, STAGE)
        v0, v1, v2, v3 = staging._load_words(sbase, words, STAGE)
        out = out_ptr + r * SR * W + words
        tl.store(out, v0)
        tl.store(out + 1, v1)
        tl.store(out + 2, v2)
        tl.store(out + 3, v3)
        tl.store(info_ptr + 1 + r, sbase)
        # a sum across warps: Triton's own shared memory (the area is addressed from its symbol)
        tl.store(info_ptr + 1 + ROUNDS, tl.sum(tl.sum(v0.to(tl.float32), axis=1), axis=0))
        tl.debug_barrier()              # every read done before the next copy overwrites
    tl.store(info_ptr, staging.area(STAGE))


@pytest.mark.parametrize("k,sr", [(256, 16), (512, 8)])
def test_staged_rows_read_back_as_copied(k, sr):
    rows, rounds, stage = 16, 3, 16 * 1024 + STAGE_HEAD
    src = torch.randn(rounds, rows, k, device="cuda").to(torch.bfloat16)
    out = torch.full((rounds, sr, k // 2), -1, device="cuda", dtype=torch.int32)
    info = torch.zeros(2 + rounds, dtype=torch.int32, device="cuda")
    args = (src, out, info, rows, k, sr, rounds, stage)
    built = _round_trip.warmup(*args, grid=(1,))
    reserve_staging(built, stage)
    _round_trip[(1,)](*args)
    torch.cuda.synchronize()
    area, *bases = info.tolist()[:-1]
    assert area % 16 == 0 and all(b == area + STAGE_HEAD for b in bases), info.tolist()
    assert torch.equal(out, src[:, :sr].contiguous().view(torch.int32))
