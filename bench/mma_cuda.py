"""How fast a projection streams at 16-64 rows in the CUDA backend's form, with tensor cores.

The CUDA backend's projections multiply on the CUDA cores with x held in registers, which is
right at 1-5 rows and out of reach at 17-64 (the batch-size issue's rows). This benchmark is the
first measurement of the form that would replace them there: y = x @ W^T for x [B, K], W [N, K]
(bf16, fp32 accumulation) on P blocks (one an SM) of eight consumer warps and a producer warp.

    producer   walks the block's tasks (ROWS weight rows each, tasks b, b + P, ...) and copies
               each group of 8 rows into a ring of NG group slots with bulk copies (a row a
               copy, rows 32 bytes apart beyond their length so that the consumers' loads meet
               no bank conflict), as far ahead as the ring holds
    consumers  wait for a task's groups, split K between the warps (warp w takes the 16-wide
               k-steps w, w + 8, ...), load x's fragments from L2 (8 bytes a thread a row) and
               the rows' from shared memory, ``mma.sync.m16n8k16`` (bf16 in, fp32 out), free
               the groups, then sum the warps' partials through shared memory an 8-row tile at
               a time and store y in bf16

Inside a 16-wide k-step the products take k in a permuted order, the same for x and W (a
thread's 8 contiguous bytes hold logical k 2t, 2t+1, 2t+8, 2t+9): one 8-byte load a row for
each operand instead of two 4-byte ones. x is read from L2 once a task: B / ROWS times the
task's weight bytes, the quantity this benchmark is for.

This is the ``rows`` form; ``bench/mma_tiles.py`` holds the ``tiles`` form (x's chunk in shared
memory for 128 or 256 rows, by TMA tensor copies), ``bench/mma_backend.py`` the ``backend``
form (the CUDA backend's own projection body, alone).

    python -m megakernel.bench.mma_cuda --batches 16,32,64 --forms rows,tiles,backend \\
        [--rows 16,32] [--tile-rows 128,256] [--clusters 1,2,4] [--backend-rows 32,64,128] \\
        [--flight-kib 64,0] [--page-kib 16,32] [--n 65536 --k 2048] [--chunk-log 4096]

Prints microseconds a launch and the weights' TB/s of each (batch, form, rows) beside
``torch.mm`` on the same operands; every launch's y is checked against an fp32 product.
"""
from __future__ import annotations

import argparse
import ctypes

import torch

from megakernel.compiler.cuda_codegen import NCW, SMEM_LIMIT

NT = 32 * (NCW + 1)                    # threads a block: the consumer warps and the producer's

# y[16 x 8] += a[16 x 16] (row-major) @ b[16 x 8] (col-major), bf16 in, fp32 out (both forms)
MMA16816 = r"""
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
"""

SOURCE = r"""
#include "megakernel_ring.cuh"
using namespace mk;
constexpr int NCW = 8, NT = NCW * 32;
constexpr int BP = (B + 15) / 16 * 16, MT = BP / 16;   // batch rows padded to m-tiles
constexpr int RS = K * 2 + 32;            // a row's bytes in its slot (skewed)
constexpr int GROUP = 8 * RS;             // a group slot: 8 rows
constexpr int G = ROWS / 8, KS = K / 16;  // groups a task, k-steps
static_assert(ROWS % 8 == 0 && K % (16 * NCW) == 0 && G <= NG, "shape");
""" + MMA16816 + r"""
__device__ void produce(const bf16* w, int tasks, unsigned char* ring, uint64_t* full,
                        uint64_t* empty) {
  int n = 0;   // groups issued
  for (int task = blockIdx.x; task < tasks; task += gridDim.x)
    for (int j = 0; j < G; ++j, ++n) {
      const int s = n % NG, round = n / NG;
      if (round) mbar_wait(empty + s, (round - 1) & 1);
      mbar_expect(full + s, 8 * K * 2);
      for (int r = 0; r < 8; ++r)
        bulk_copy(ring + s * GROUP + r * RS, w + (int64_t)(task * ROWS + j * 8 + r) * K, K * 2,
                  full + s);
    }
}

extern "C" __global__ void __launch_bounds__(NT + 32, 1)
mma_proj(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* y, int n_rows) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* ring = smem;
  float* red = reinterpret_cast<float*>(smem + NG * GROUP);   // [NCW, BP, 8]
  uint64_t* full = reinterpret_cast<uint64_t*>(red + NCW * BP * 8);
  uint64_t* empty = full + NG;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int tasks = n_rows / ROWS;
  if (threadIdx.x == 0) {
    for (int s = 0; s < NG; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == NCW) {
    if (lane == 0) produce(w, tasks, ring, full, empty);
    return;
  }
  int n = 0;   // groups consumed
  for (int task = blockIdx.x; task < tasks; task += gridDim.x, n += G) {
    float c[MT][G][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < G; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[m][j][e] = 0.f;
    for (int j = 0; j < G; ++j) mbar_wait(full + (n + j) % NG, ((n + j) / NG) & 1);
#pragma unroll UNROLL
    for (int ks = warp; ks < KS; ks += NCW) {
      const int k = ks * 16 + 4 * t;   // this thread's 4 physical k of the step
      uint2 lo[MT], hi[MT];             // x rows m * 16 + g and + 8
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int r0 = m * 16 + g, r1 = r0 + 8;
        lo[m] = r0 < B ? __ldcg(reinterpret_cast<const uint2*>(x + (int64_t)r0 * K + k))
                       : make_uint2(0, 0);
        hi[m] = r1 < B ? __ldcg(reinterpret_cast<const uint2*>(x + (int64_t)r1 * K + k))
                       : make_uint2(0, 0);
      }
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const uint2 b = *reinterpret_cast<const uint2*>(
            ring + ((n + j) % NG) * GROUP + g * RS + k * 2);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const uint32_t a[4] = {lo[m].x, hi[m].x, lo[m].y, hi[m].y};
          mma16816(c[m][j], a, b.x, b.y);
        }
      }
    }
    consumers_sync(NT);   // every warp's reads of the groups done
    if (threadIdx.x == 0)
      for (int j = 0; j < G; ++j) mbar_arrive(empty + (n + j) % NG);
#pragma unroll
    for (int j = 0; j < G; ++j) {
      // c[m][j]: (batch m * 16 + g, row 2t, 2t + 1) and (batch + 8, the same rows)
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        float* p = red + (warp * BP + m * 16 + g) * 8 + 2 * t;
        p[0] = c[m][j][0];
        p[1] = c[m][j][1];
        p[64] = c[m][j][2];
        p[65] = c[m][j][3];
      }
      consumers_sync(NT);
      for (int i = threadIdx.x; i < B * 8; i += NT) {
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < NCW; ++v) s += red[v * BP * 8 + i];
        y[(int64_t)(i / 8) * n_rows + task * ROWS + j * 8 + i % 8] = __float2bfloat16(s);
      }
      consumers_sync(NT);
    }
  }
}
"""


def config_source(batch: int, k: int, rows: int, groups: int, unroll: int = 8) -> str:
    """The kernel for one shape: ``unroll`` k-steps a warp's loop body (8: 1.80 TB/s at 16 x
    16, 2: 1.60; the same at more rows)."""
    return (f"constexpr int B = {batch}, K = {k}, ROWS = {rows}, NG = {groups}, "
            f"UNROLL = {unroll};\n") + SOURCE


def padded(batch: int) -> int:
    """Batch rows rounded up to whole 16-row m-tiles."""
    return -(-batch // 16) * 16


def smem_bytes(batch: int, k: int, groups: int) -> int:
    return groups * 8 * (2 * k + 32) + NCW * padded(batch) * 8 * 4 + 2 * groups * 8


def ring_groups(batch: int, k: int, rows: int) -> int:
    """As many 8-row group slots as shared memory holds (at least a task's)."""
    groups = (SMEM_LIMIT - smem_bytes(batch, k, 0)) // (8 * (2 * k + 32) + 16)
    if groups < rows // 8:
        raise SystemExit(f"a task of {rows} rows of {k} does not fit in shared memory")
    return groups


def rows_source(batch: int, k: int, rows: int, cluster: int = 1) -> tuple[str, int]:
    groups = ring_groups(batch, k, rows)
    return config_source(batch, k, rows, groups), smem_bytes(batch, k, groups)


def rows_args(driver, x, w, y, rows: int) -> list:
    return [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()),
            ctypes.c_void_p(y.data_ptr()), ctypes.c_int(w.shape[0])]


def forms() -> dict:
    """form -> (kernel name, source and shared memory of a shape, launch arguments)."""
    from megakernel.bench.mma_backend import backend_args, backend_source
    from megakernel.bench.mma_tiles import tiles_args, tiles_source

    return {"rows": ("mma_proj", rows_source, rows_args),
            "tiles": ("mma_tiles", tiles_source, tiles_args),
            "backend": ("mma_backend", backend_source, backend_args)}


def print_waits(driver, operands, grid: int, stream: int, source: tuple[str, int],
                n: int) -> None:
    """One launch of the backend form built with wait logs of ``n`` entries a stream; their
    medians (``runtime.trace.chunk_table``)."""
    from megakernel.bench.mma_backend import backend_args
    from megakernel.runtime.cuda_step import build_cubin
    from megakernel.runtime.trace import LOG_WORDS, chunk_lines, chunk_table, wait_entries

    func = driver.load(build_cubin(source[0]), "mma_backend", source[1])
    log = torch.zeros(grid * 3 * n * LOG_WORDS, dtype=torch.int64, device="cuda")
    driver.launch(func, grid, NT, source[1], stream, backend_args(driver, *operands, log=log))
    torch.cuda.synchronize()
    for line in chunk_lines(chunk_table([dict(r, kind="backend")
                                         for r in wait_entries(log.tolist(), n)])):
        print("  " + line, flush=True)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv=None) -> int:
    from megakernel.bench.decode import median_step_ms
    from megakernel.runtime.cuda_step import Driver, build_cubin

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="16,32,64")
    ap.add_argument("--forms", default="rows,tiles")
    ap.add_argument("--rows", default="16,32",
                    help="weight rows a task of the rows form (the tiles form: 128,256)")
    ap.add_argument("--tile-rows", default="128,256", help="weight rows a task, tiles form")
    ap.add_argument("--clusters", default="1,2,4", help="blocks a cluster, tiles form")
    ap.add_argument("--backend-rows", default="32,64,128", help="weight rows a task, backend form")
    ap.add_argument("--flight-kib", default="64",
                    help="backend form: KiB of weight pages in flight at most (0: the ring)")
    ap.add_argument("--page-kib", default="16",
                    help="backend form: KiB a ring page (as many 64-column chunks as fit, up "
                         "to 4)")
    ap.add_argument("--x-stages", default="0",
                    help="backend form: stages of x's chunks (0: the backend's choice)")
    ap.add_argument("--chunks", default="4", help="backend form: chunks a page at most")
    ap.add_argument("--chunk-log", type=int, default=0,
                    help="backend form: also one launch with wait logs of this many entries "
                         "(medians printed, as the megakernel's --chunk-log)")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    blocks = torch.cuda.get_device_properties(0).multi_processor_count
    n, k = args.n, args.k
    w = torch.randn(n, k, device="cuda").div_(k ** 0.5).bfloat16()
    driver = Driver()
    stream = torch.cuda.current_stream().cuda_stream
    shapes = {"rows": [(r, 1, {}) for r in _ints(args.rows)],
              "tiles": [(r, c, {}) for r in _ints(args.tile_rows) for c in _ints(args.clusters)],
              "backend": [(r, 1, {"flight_kib": f, "page_kib": p, "stages": xs,
                                  "chunks": c})
                          for r in _ints(args.backend_rows) for f in _ints(args.flight_kib)
                          for p in _ints(args.page_kib) for xs in _ints(args.x_stages)
                          for c in _ints(args.chunks)]}
    for batch in [int(b) for b in args.batches.split(",")]:
        x = torch.randn(batch, k, device="cuda").bfloat16()
        ref = x.float() @ w.float().T                                    # [B, N]
        cublas_ms = median_step_ms(lambda: torch.mm(x, w.T), x.device, 3, args.iters)
        print(f"B={batch:3d} torch.mm {cublas_ms * 1e3:8.1f} us "
              f"{n * k * 2 / cublas_ms / 1e9:5.2f} TB/s", flush=True)
        for form in args.forms.split(","):
            name, source_of, args_of = forms()[form]
            for rows, cluster, extra in shapes[form]:
                if n % (rows * cluster):
                    raise SystemExit(f"--n {n} rows in tasks of {rows} in clusters of "
                                     f"{cluster}: not whole")
                source, smem = source_of(batch, k, rows, cluster, **extra)
                func = driver.load(build_cubin(source), name, smem)
                grid = blocks // cluster * cluster  # as many clusters as are held at once
                if cluster > 1:
                    grid = cluster * min(grid // cluster, driver.max_active_clusters(
                        func, grid, NT, smem, cluster))
                    if not grid:
                        raise SystemExit(f"no cluster of {cluster} blocks of {smem} bytes fits")
                y = torch.full((batch, n), float("nan"), device="cuda").bfloat16()
                launch_args = args_of(driver, x, w, y, rows)

                def launch():
                    driver.launch(func, grid, NT, smem, stream, launch_args, cluster)

                launch()
                torch.cuda.synchronize()
                err = ((y.float() - ref).norm() / ref.norm()).item()
                ms = median_step_ms(launch, x.device, 3, args.iters)
                print(f"B={batch:3d} {form:5s} rows={rows:3d} cluster={cluster} "
                      + "".join(f"{key}={v} " for key, v in extra.items())
                      + f"blocks={grid}: {ms * 1e3:8.1f} us {n * k * 2 / ms / 1e9:5.2f} TB/s  "
                      f"rel err {err:.1e}", flush=True)
                if not err < 1e-2:
                    raise SystemExit(f"wrong product: B={batch}, {form}, rows={rows}, "
                                     f"cluster={cluster}: {err}")
                if form == "backend" and args.chunk_log:
                    print_waits(driver, (x, w, y, rows), grid, stream, source_of(
                        batch, k, rows, cluster, **extra, chunk_log=args.chunk_log),
                        args.chunk_log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
