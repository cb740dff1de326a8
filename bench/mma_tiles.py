"""The ``tiles`` form of ``bench/mma_cuda.py``: y = x @ W^T with x's chunk in shared memory,
read from L2 once for ROWS weight rows.

A task is ROWS weight rows (a multiple of 128) over the whole of K, walked in chunks of 64
(128 bytes a row). For each chunk the producer warp copies the task's [ROWS, 64] weight tile and
x's [BP, 64] chunk (BP: B rounded up to 16; rows past B come as zeros) into a stage of the
ring with two TMA tensor copies (``cp.async.bulk.tensor``, 128-byte swizzle: a row's 16-byte
pieces rotated by the row's index mod 8, so that ``ldmatrix`` meets no bank conflict). Each
consumer warp owns ROWS / 8 of the rows for the whole task (no sum across warps): per 16-wide
k-step it takes x's fragments and its rows' by ``ldmatrix`` and runs ``mma.sync.m16n8k16``
(bf16 in, fp32 accumulators in registers), frees the stage, and after the last chunk stores its
rows of y. x's L2 bytes are B / ROWS of the weights'.

Blocks may run in clusters of CL (2, 4, 8): block 0 of a cluster then copies x's chunk into
every block of it at once (TMA multicast), each block takes other rows of the same chunks, and a
stage is refilled once every block's warps have freed it: x's L2 bytes are B / (CL * ROWS) of
the weights'.
"""
from __future__ import annotations

import ctypes

from megakernel.bench.mma_cuda import MMA16816, padded
from megakernel.compiler.cuda_codegen import KC, SMEM_LIMIT   # KC: k a stage, 128 bytes a row

SOURCE = r"""
#include "megakernel_mma.cuh"   // tma_2d, ldsm_x4, swz, KC
using namespace mk;
constexpr int NCW = 8, NT = NCW * 32;
constexpr int BP = (B + 15) / 16 * 16, MT = BP / 16;   // x rows padded to m-tiles
constexpr int WR = ROWS / NCW, NTW = WR / 8;           // rows a warp, its n-tiles
constexpr int WBYTES = ROWS * 128, STAGE = WBYTES + BP * 128, CHUNKS = K / KC;
static_assert(ROWS % 128 == 0 && ROWS <= 256 && K % KC == 0 && BP <= 256, "shape");

// the same copy into the same offset of every block of the cluster in `mask`, each block's
// barrier at `bar`'s offset told of its bytes
__device__ __forceinline__ void tma_2d_multicast(void* dst, const CUtensorMap* map, int col,
                                                 int row, uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
      ::"r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row),
      "r"(smem_u32(bar)), "h"(mask) : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// every thread of every block of the cluster (a block alone without clusters)
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

// arrive on the barrier at `bar`'s offset in block `rank` of the cluster
__device__ __forceinline__ void arrive_remote(uint64_t* bar, uint32_t rank) {
  uint32_t addr;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(addr) : "r"(smem_u32(bar)),
               "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(addr)
               : "memory");
}

""" + MMA16816 + r"""
// The consumer warps: each task's chunks as they land, then its rows of y.
__device__ void consume(unsigned char* smem, uint64_t* full, uint64_t* empty, bf16* y,
                        int n_rows, int first, int tasks, int step, int rank, int warp,
                        int lane) {
  const int g = lane / 4, t = lane % 4;
  int n = 0;
  for (int task = first; task < tasks; task += step) {
    float c[MT][NTW][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NTW; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[m][j][e] = 0.f;
    for (int ch = 0; ch < CHUNKS; ++ch, ++n) {
      const int s = n % NS;
      mbar_wait(full + s, (n / NS) & 1);
      const unsigned char* wt = smem + s * STAGE;
      const unsigned char* xt = wt + WBYTES;
#pragma unroll
      for (int kk = 0; kk < KC / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)   // rows m*16 + lane % 16, k pieces 2kk + lane / 16
          ldsm_x4(a[m], xt + swz(m * 16 + lane % 16, 2 * kk + lane / 16));
#pragma unroll
        for (int j = 0; j < NTW; j += 2) {   // n-tiles j, j + 1: (b0, b1) each
          uint32_t b[4];
          ldsm_x4(b, wt + swz(warp * WR + (j + lane / 16) * 8 + lane % 8,
                              2 * kk + (lane / 8) % 2));
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma16816(c[m][j], a[m], b[0], b[1]);
            mma16816(c[m][j + 1], a[m], b[2], b[3]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(empty + s);
        if (CL > 1 && rank) arrive_remote(empty + s, 0);   // block 0's x copy waits for it
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NTW; ++j) {   // (batch m*16 + g [+ 8], rows 2t, 2t + 1 of tile j)
        const int col = task * ROWS + warp * WR + j * 8 + 2 * t, b0 = m * 16 + g;
        if (b0 < B)
          *reinterpret_cast<__nv_bfloat162*>(y + (int64_t)b0 * n_rows + col) =
              __floats2bfloat162_rn(c[m][j][0], c[m][j][1]);
        if (b0 + 8 < B)
          *reinterpret_cast<__nv_bfloat162*>(y + (int64_t)(b0 + 8) * n_rows + col) =
              __floats2bfloat162_rn(c[m][j][2], c[m][j][3]);
      }
  }
}

extern "C" __global__ void __launch_bounds__(NT + 32, 1)
mma_tiles(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
          bf16* y, int n_rows) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // the swizzle's pattern is of address bits: stages start on 1024-byte boundaries
  unsigned char* smem = smem_raw + (-smem_u32(smem_raw) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + NS * STAGE);
  uint64_t* empty = full + NS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // tasks b, b + P, ... (b = cluster * CL + rank): with P and the task count multiples of CL a
  // cluster's blocks walk the same number of chunks, in step
  const int rank = CL > 1 ? cluster_rank() : 0, first = blockIdx.x;
  const int tasks = n_rows / ROWS, step = gridDim.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < NS; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, rank ? NCW : NCW * CL);   // block 0 copies x for the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();   // every block's barriers initialised before any copy or remote arrive
  if (warp == NCW) {   // the producer: every chunk's weight tile and x chunk, in order
    if (lane == 0) {
      int n = 0;
      for (int task = first; task < tasks; task += step)
        for (int ch = 0; ch < CHUNKS; ++ch, ++n) {
          const int s = n % NS, round = n / NS;
          if (round) mbar_wait(empty + s, (round - 1) & 1);
          mbar_expect(full + s, STAGE);
          tma_2d(smem + s * STAGE, &wmap, ch * KC, task * ROWS, full + s);
          if (CL == 1)
            tma_2d(smem + s * STAGE + WBYTES, &xmap, ch * KC, 0, full + s);
          else if (rank == 0)
            tma_2d_multicast(smem + s * STAGE + WBYTES, &xmap, ch * KC, 0, full + s,
                             (1 << CL) - 1);
        }
    }
  } else {
    consume(smem, full, empty, y, n_rows, first, tasks, step, rank, warp, lane);
  }
  cluster_sync();   // no block leaves while another may still copy into it or arrive on it
}

"""


def stages(batch: int, rows: int) -> int:
    """As many stages ([rows, 64] weights and [padded batch, 64] of x) as shared memory holds."""
    stage = (rows + padded(batch)) * 128
    count = (SMEM_LIMIT - 1024) // (stage + 16)
    if count < 2 or rows % 128 or rows > 256:
        raise SystemExit(f"tiles form: {rows} rows a task (128 or 256) at batch {batch}")
    return count


def tiles_source(batch: int, k: int, rows: int, cluster: int = 1) -> tuple[str, int]:
    """The kernel's source for one shape and its dynamic shared memory; ``cluster`` > 1:
    blocks in clusters of that many, block 0 of each copying x's chunks to all of them
    (multicast), so that x's L2 bytes are B / (cluster * rows) of the weights'."""
    if cluster not in (1, 2, 4, 8):
        raise SystemExit(f"tiles form: clusters of 1, 2, 4 or 8 blocks, not {cluster}")
    ns = stages(batch, rows)
    source = (f"constexpr int B = {batch}, K = {k}, ROWS = {rows}, NS = {ns}, "
              f"CL = {cluster};\n") + SOURCE
    return source, ns * ((rows + padded(batch)) * 128 + 16) + 1024   # + alignment slack


def tiles_args(driver, x, w, y, rows: int) -> list:
    """Launch arguments: the weights' and x's tensor maps, y, N."""
    (batch, k), n = x.shape, w.shape[0]
    wmap = driver.tensor_map(w.data_ptr(), n, k, rows, KC)
    xmap = driver.tensor_map(x.data_ptr(), batch, k, padded(batch), KC)
    return [wmap.param, xmap.param, ctypes.c_void_p(y.data_ptr()), ctypes.c_int(n)]
