"""The CUDA backend on the GPU (skipped without CUDA): bf16 against eager as the Triton kernel is
held to it, and the watchdog on a broken schedule."""
import time
from dataclasses import replace

import pytest
import torch
from test_megakernel_gpu import assert_as_accurate_as_eager, teacher_forced

from megakernel.compiler.registry import HEADER
from megakernel.compiler.tile import TileConfig
from megakernel.models import load_model
from megakernel.runtime import allocate_kv_cache
from megakernel.runtime.megakernel import WatchdogError, megakernel_backend

pytestmark = pytest.mark.gpu
# what the CUDA backend builds: norms from the writers' sums of squares, no K slices
CUDA_TILE = TileConfig(norm_first=True, norm_sums=True, split_k=1, kv_split=128, kv_block=128)


FUSED = replace(CUDA_TILE, fuse_combine=True)
SLICED = replace(FUSED, split_k=4, kv_split=256, kv_block=16)   # tensor cores' K slices
LONG_KEYS = replace(SLICED, kv_split=1024, kv_block=128)          # 8 cache blocks a task


@pytest.mark.parametrize("batch,tile,knobs", [(1, CUDA_TILE, {}), (2, CUDA_TILE, {}),
                                              (5, CUDA_TILE, {}), (1, FUSED, {}), (3, FUSED, {}),
                                              (1, FUSED, {"kv_ring": True}),
                                              (3, CUDA_TILE, {"kv_ring": True}),
                                              (17, CUDA_TILE, {"mma_chunks": 1}),
                                              (17, SLICED, {"kv_ahead": 2}),
                                              (17, LONG_KEYS, {"kv_ring": True}),
                                              (17, LONG_KEYS, {"attn_runs": 2}),
                                              (1, FUSED, {"kv_ring": True, "attn_mma": True}),
                                              (17, LONG_KEYS, {"kv_ring": True,
                                                               "attn_mma": True})])
def test_cuda_backend_is_as_accurate_as_bf16_eager(batch, tile, knobs):
    """tile: also with fused combines (each unit merged by its last attention piece); knobs:
    the CUDA kernel's own (keys and values through the ring; the cache's unwritten rows are NaN,
    so a stale row read from a page would show; tensor-core pages of one chunk; attention's
    L2 prefetches held near the consumers; a task's 16 pages of keys and values streamed
    through a ring of fewer; two runs of keys a warp in flight; attention on tensor cores)."""
    assert_as_accurate_as_eager(teacher_forced("llama-3.2-1b", batch, kernel="cuda",
                                               cuda=knobs, tile=tile))


@pytest.mark.parametrize("batch", [1, 3, 17, 64])
def test_megakernel_cuda_backend_is_as_accurate_as_bf16_eager(batch):
    """The ``megakernel-cuda`` backend (no compile options): the tuned or default kernel's
    variant in the form the CUDA backend builds (``effective.cuda_form``); from 5 rows on its
    projections on tensor cores, from 8 on o and down in K slices."""
    assert_as_accurate_as_eager(teacher_forced("llama-3.2-1b", batch, kernel="cuda"))


def test_cuda_backend_dropped_signal_raises_watchdog_quickly():
    model = load_model("tiny-llama", device="cuda", dtype="bfloat16", progress=False).model
    cache = allocate_kv_cache(model.config, 2, 64, dtype=torch.bfloat16, device="cuda")
    step = megakernel_backend(model, cache, kernel="cuda", num_workers=16, tile=TileConfig(
        norm_first=True, norm_sums=True, split_k=1))
    tokens = torch.zeros(2, 1, dtype=torch.long, device="cuda")
    positions = torch.full((2, 1), 3, device="cuda")
    step(tokens, positions, cache)
    step.synchronize()
    victim = [c for ws in step.compiled.sync.waits for c in ws][0]
    signal = HEADER.index("signal")
    step.ins[(step.ins[:, signal] == victim).nonzero().flatten()[0], signal] = -1
    t0 = time.perf_counter()
    with pytest.raises(WatchdogError, match="counter"):
        step(tokens, positions, cache)
        step.synchronize()
    assert time.perf_counter() - t0 < 2.0
