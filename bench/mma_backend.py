"""The ``backend`` form of ``bench/mma_cuda.py``: y = x @ W^T by the CUDA backend's own
tensor-core projection (``templates/megakernel_mma.cuh``), alone.

Each block is a worker as the megakernel builds it: a producer warp (``WeightProducer``:
weight tiles by TMA over W read as the arena, pages of a chunk's ROWS rows, at most
``flight_kib`` KiB in flight) and eight consumer warps (``Ctx::project``: x's chunks by tensor
copies from a map of x into XS stages, mma.sync into acc, then y stored from ``Ctx::result``).
Tasks of ROWS weight rows over the whole of K, tasks b, b + P, ... on block b. Beside the
tiles form (x with the weights in one stage, every stage in flight) it says how fast the
backend's body streams on its own (H200, 17 rows: 3.6 TB/s with 128-row tasks, 1.4 with 32:
the rate follows the rows a chunk).
"""
from __future__ import annotations

import ctypes

from megakernel.compiler.cuda_codegen import (MMA_PAGE, NCW, SMEM_LIMIT,
                                              mma_parts, x_bytes, x_stages)

SOURCE = r"""
#include "megakernel_ctx.cuh"
using namespace mk;
typedef Ctx<NCW, NPAGE, PAGE, B, true, XS> C;
typedef WeightProducer<NPAGE, PAGE, NCW, NPAGE, FLIGHT_BYTES, true, 1> P;

extern "C" __global__ void __launch_bounds__((NCW + 1) * 32, 1)
mma_backend(const __grid_constant__ Maps<1> maps, const bf16* w, const bf16* x, bf16* y,
            int n_rows, int64_t* log) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + (-smem_u32(smem_raw) & 1023);
  unsigned char* xs = smem + NPAGE * PAGE;
  uint64_t* full = reinterpret_cast<uint64_t*>(xs + XBYTES);
  uint64_t* empty = full + NPAGE;
  float* acc = reinterpret_cast<float*>(empty + NPAGE);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tasks = n_rows / ROWS;
  if (threadIdx.x == 0) {
    for (int s = 0; s < NPAGE; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, NCW);
    }
    C::init_x(xs, maps.x, x);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == NCW) {
    if (lane == 0) {
      P p{ { {smem, full, empty} }, maps.m, w, {K} };
      if (MK_CHUNK_LOG && log != nullptr) p.log.p = wait_log_at(log, 2);   // as the megakernel's
      for (int task = blockIdx.x; task < tasks; task += gridDim.x) {
        p.task = task;
        p.template project<K, 1>({w + (int64_t)task * ROWS * K}, ROWS);
      }
    }
    return;
  }
  C c{ {smem, full, empty}, acc, nullptr, nullptr, xs, (int)threadIdx.x, warp, lane};
  if (MK_CHUNK_LOG && log != nullptr && lane == 0 && (warp == 0 || warp == NCW - 1))
    c.log.p = wait_log_at(log, warp != 0);
  for (int task = blockIdx.x; task < tasks; task += gridDim.x) {
    c.task = task;
    c.template project<K, 1, ROWS>(x, ROWS);
    for (int i = c.t; i < ROWS * B; i += C::NT)
      y[(int64_t)(i / ROWS) * n_rows + task * ROWS + i % ROWS] =
          __float2bfloat16(c.template result<K>(i % ROWS, i / ROWS));
    c.sync();   // acc read by all before the next task writes it
  }
}
"""


def backend_source(batch: int, k: int, rows: int, cluster: int = 1,
                   flight_kib: int = 64,
                   page_kib: int = MMA_PAGE // 1024, stages: int = 0,
                   chunks: int = 4, chunk_log: int = 0) -> tuple[str, int]:
    """The kernel for one shape and its dynamic shared memory: pages of ``page_kib`` KiB (a
    chunk of ``rows`` rows at least; as many chunks as fit, up to ``chunks``), as many as fit
    beside x's ``stages`` (0: the backend's choice) and acc, at most
    ``flight_kib`` KiB of them in flight (0: as many as the ring holds); ``chunk_log``: wait
    logs of that many entries a stream (``backend_args``' ``log``; ``runtime.trace.wait_entries``
    reads them)."""
    if cluster != 1 or rows % 8 or rows > 128:
        raise SystemExit(f"backend form: tasks of 8-128 rows (a multiple of 8), no clusters; "
                         f"not {rows} in clusters of {cluster}")
    xs = stages or x_stages(batch)
    xbytes = x_bytes(batch, xs)
    page = max(page_kib * 1024, -(-rows * 128 // 1024) * 1024)
    fixed = xbytes + 4 * mma_parts(1, rows) * batch + 1024
    npage = min(32, (SMEM_LIMIT - fixed) // (page + 16))
    if npage < 2:
        raise SystemExit(f"backend form: pages of {page} bytes, fewer than two fit")
    source = (f"#define MK_CHUNKS {chunks}\n#define MK_CHUNK_LOG {chunk_log}\n"
              f"constexpr int NCW = {NCW}, NPAGE = {npage}, PAGE = {page}, B = {batch}, "
              f"K = {k}, ROWS = {rows}, XS = {xs}, XBYTES = {xbytes}, "
              f"FLIGHT_BYTES = {flight_kib * 1024};\n") + SOURCE
    return source, fixed + npage * (page + 16)


def backend_args(driver, x, w, y, rows: int, log=None) -> list:
    """Launch arguments: W's and x's maps (W and x as the arenas), W, x, y, N, the wait logs'
    int64 buffer (``log``: 3 streams a block of ``chunk_log`` entries, or none)."""
    from megakernel.runtime.cuda_step import kernel_maps

    maps = kernel_maps(driver, w.view(-1), (w.shape[1],), x.view(-1), x.shape[0])
    return [maps.param, ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(x.data_ptr()),
            ctypes.c_void_p(y.data_ptr()), ctypes.c_int(w.shape[0]),
            ctypes.c_void_p(0 if log is None else log.data_ptr())]
