"""What the CUDA backend's small operations cost a thread, alone and beside a weight stream: the
calibration of the wait logs (``chunk_log``), whose stamps are ``%globaltimer`` reads.

P blocks (one an SM) of eight consumer warps and a producer warp, as a megakernel worker. Lane 0
of consumer warp 0 times N repetitions of each operation by ``clock64`` and ``%globaltimer``:

    timer     a ``%globaltimer`` read (as the logs take them, each after the last)
    done      ``mbarrier.try_wait.parity`` on a phase already completed (a page's wait when the
              page has landed: ``mbar_done``)
    arrive    ``mbarrier.arrive`` on a barrier that never completes (a page or x chunk freed)
    smem      a 16-byte shared-memory load whose address follows the last load's value (a
              shared-memory round trip)

Meanwhile the other consumer warps spin on a completed barrier's ``try_wait`` (as warps that
wait for a page) and, with ``--loads L``, the producer warp keeps L bulk copies of 16 KB in
flight from a 1 GiB buffer (the weight stream).

    python -m megakernel.bench.wait_costs --loads 0,2,8 [--reps 4096]

Prints, for each load, nanoseconds and cycles an operation (medians over the blocks).
"""
from __future__ import annotations

import argparse
import ctypes

import torch

SMEM = 8 * 16384 + 1024
OPS = ("timer", "done", "arrive", "smem")
SOURCE = r"""
#include "megakernel_ctx.cuh"
using namespace mk;
constexpr int NCW = 8, NPAGE = 8, PAGE = 16384;

extern "C" __global__ void __launch_bounds__((NCW + 1) * 32, 1)
wait_costs(const unsigned char* weights, long long weight_bytes, int reps, int loads,
           long long* out) {
  extern __shared__ __align__(1024) unsigned char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + NPAGE * PAGE);   // pages', done, arrive
  uint4* chain = reinterpret_cast<uint4*>(bars + NPAGE + 2);          // [32]
  __shared__ volatile int stop;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < NPAGE; ++s) mbar_init(bars + s, 1);
    mbar_init(bars + NPAGE, 1);
    mbar_init(bars + NPAGE + 1, (1u << 20) - 1);   // never completes (reps below it)
    for (int i = 0; i < 32; ++i) chain[i] = make_uint4((i + 1) % 32, 0, 0, 0);
    stop = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  uint64_t* done = bars + NPAGE;
  if (threadIdx.x == 0) mbar_arrive(done);   // its phase 0 completed
  __syncthreads();
  if (warp == NCW) {   // the stream: `loads` 16 KB copies in flight until the timing ends
    if (lane == 0 && loads > 0) {
      const long long pages = weight_bytes / PAGE;
      long long next = blockIdx.x * 4099LL % pages;
      uint32_t k = 0;
      for (; !stop; ++k) {
        if (k >= (uint32_t)loads) {   // the copy `loads` back landed (its page free again)
          const uint32_t old = k - loads;
          mbar_wait(bars + old % NPAGE, (old / NPAGE) & 1);
        }
        mbar_expect(bars + k % NPAGE, PAGE);
        bulk_copy(smem + k % NPAGE * PAGE, weights + next * PAGE, PAGE, bars + k % NPAGE);
        next = (next + 132) % pages;
      }
      for (uint32_t j = k > (uint32_t)loads ? k - loads : 0; j < k; ++j)   // the last land
        mbar_wait(bars + j % NPAGE, (j / NPAGE) & 1);
    }
    return;
  }
  if (warp != 0) {   // waiting warps: try_wait on a completed phase until the timing ends
    while (!stop) mbar_done(done, 0);
    return;
  }
  if (lane != 0) return;
  long long* o = out + blockIdx.x * 8;
  long long c0, t0, sink = 0;
  c0 = clock64(), t0 = globaltimer();
  for (int i = 0; i < reps; ++i) sink += globaltimer();
  o[0] = clock64() - c0, o[1] = globaltimer() - t0;
  c0 = clock64(), t0 = globaltimer();
  for (int i = 0; i < reps; ++i) sink += mbar_done(done, 0);
  o[2] = clock64() - c0, o[3] = globaltimer() - t0;
  c0 = clock64(), t0 = globaltimer();
  for (int i = 0; i < reps; ++i) mbar_arrive(bars + NPAGE + 1);
  o[4] = clock64() - c0, o[5] = globaltimer() - t0;
  unsigned idx = 0;
  c0 = clock64(), t0 = globaltimer();
  for (int i = 0; i < reps; ++i) idx = reinterpret_cast<volatile unsigned*>(chain)[4 * idx];
  o[6] = clock64() - c0, o[7] = globaltimer() - t0;
  if (sink == 42 && idx == 99) o[0] = 0;   // (keeps the loops)
  stop = 1;
}
"""


def run(driver, func, blocks: int, reps: int, loads: int, weights: torch.Tensor) -> dict:
    """Median over the blocks of ns and cycles an operation."""
    out = torch.zeros(blocks, 8, dtype=torch.int64, device=weights.device)
    args = [ctypes.c_void_p(weights.data_ptr()), ctypes.c_longlong(weights.numel()),
            ctypes.c_int(reps), ctypes.c_int(loads), ctypes.c_void_p(out.data_ptr())]
    driver.launch(func, blocks, 9 * 32, SMEM, torch.cuda.current_stream().cuda_stream, args)
    torch.cuda.synchronize()
    med = out.double().median(dim=0).values.tolist()
    return {op: (med[2 * i + 1] / reps, med[2 * i] / reps) for i, op in enumerate(OPS)}


def main(argv=None) -> int:
    from megakernel.runtime.cuda_step import Driver, build_cubin

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0,2,8", help="16 KB copies in flight a block (0-8)")
    ap.add_argument("--reps", type=int, default=4096)
    args = ap.parse_args(argv)
    loads = [int(x) for x in args.loads.split(",")]
    if not all(0 <= x <= 8 for x in loads) or not 1 <= args.reps < (1 << 20) - 1:
        raise SystemExit("loads 0-8 copies, reps 1 to 2^20 - 2")
    blocks = torch.cuda.get_device_properties(0).multi_processor_count
    weights = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    driver = Driver()
    func = driver.load(build_cubin(SOURCE), "wait_costs", SMEM)
    for load in loads:
        costs = run(driver, func, blocks, args.reps, load, weights)
        print(f"loads={load} " + "  ".join(f"{op} {ns:.1f} ns {cyc:.0f} cycles"
                                           for op, (ns, cyc) in costs.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
