"""What one phase boundary costs in the CUDA backend's form, with and without weight streams.

P blocks (one an SM) of eight consumer warps and one producer warp run R rounds; in each round
every block writes its slice of a vector, then reads the whole vector all blocks wrote in that
round, sums it across the block and folds the sum into its next slice: the shape of a batch-1
phase boundary (each q/k/v task reads all of h). Two ways for a reader to know the slices are
there:

    counter   the block's stores, a barrier, then one thread adds 1 to a counter with
              ``red.release.gpu`` (the megakernel's ``signal_counter``); one thread of each
              reader polls the counter as a task's wait does (acquire atomics; ``relaxed``:
              relaxed loads, as ``poll_until`` without MK_ACQUIRE_POLLS), a barrier, then
              every thread loads its share of the vector from L2
    flagged   each 4-byte value travels with its round number in one 8-byte relaxed store; each
              reader thread loads its share until every word carries the round's number: no
              fence and no counter

With ``--loads N`` the producer warp keeps N bulk copies of 16 KB (from a 1 GiB buffer) in
flight for the whole run, as the megakernel's producer streams weights (two at most), so that
the release's membar and the polls meet copies in flight. Rounds alternate between two halves
of the buffers; a block writes round r + 2 only after it read all of round r + 1, so after
every block wrote round r + 1 and (by its barrier) read all of round r.

    python -m megakernel.bench.hop_cuda --slices 4,16,31 --rounds 2000 --loads 0,2,8

Prints microseconds a round for each protocol, slice length and load; every run's last vector
is checked against a float64 reference.
"""
from __future__ import annotations

import argparse
import ctypes

import torch

SMEM = 8 * 16384   # the stream's ring: NPAGE pages of PAGE bytes
SOURCE = r"""
#include "megakernel_ctx.cuh"
using namespace mk;
constexpr int NCW = 8, NT = NCW * 32, NPAGE = 8, PAGE = 16384, MAXW = 16;
constexpr int SPINS = 1 << 20;   // polls (or passes over the share) before a wait gives up

__device__ __forceinline__ float block_sum(float v, float* part, int warp, int lane) {
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  consumers_sync(NT);
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < NCW; ++w) s += part[w];
  consumers_sync(NT);   // part reused next round
  return s;
}

// The counter protocol's wait for *p >= need by one thread: the megakernel's poll_until with
// acquire atomics (mode 0) or relaxed loads (mode 1).
__device__ bool wait_mode(const int* p, int need, int mode, const int* error) {
  const int seen = mode ? poll_until<false>(p, need, SPINS, error)
                        : poll_until<true>(p, need, SPINS, error);
  return seen >= need;
}

// `flight` bulk copies of PAGE bytes kept in flight until *stop (each page re-issued as it
// lands), as the megakernel's producer keeps at most `flight` weight copies in flight.
__device__ void stream(const unsigned char* src, long long bytes, int flight, uint64_t* full,
                       unsigned char* ring, volatile int* stop) {
  uint32_t parity[NPAGE];
  long long n = 0;
  const long long pages = bytes / PAGE;
  for (int k = 0; k < flight; ++k, ++n) {
    parity[k] = 0;
    mbar_expect(full + k, PAGE);
    bulk_copy(ring + k * PAGE, src + ((blockIdx.x + n * gridDim.x) % pages) * PAGE, PAGE,
              full + k);
  }
  for (int k = 0; !*stop; k = (k + 1) % flight, ++n) {
    mbar_wait(full + k, parity[k]);
    parity[k] ^= 1;
    mbar_expect(full + k, PAGE);
    bulk_copy(ring + k * PAGE, src + ((blockIdx.x + n * gridDim.x) % pages) * PAGE, PAGE,
              full + k);
  }
  for (int k = 0; k < flight; ++k) mbar_wait(full + k, parity[k]);   // none left in flight
}

extern "C" __global__ void __launch_bounds__(NT + 32, 1)
hop(float* buf, unsigned long long* fbuf, int* counter, const unsigned char* weights,
    long long wbytes, int rounds, int slice, int flagged, int mode, int load, long long* out_t,
    float* out_v, int* error) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t full[NPAGE];
  __shared__ float part[NCW];
  __shared__ volatile int stop, fail;
  const int P = gridDim.x, n = P * slice, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = threadIdx.x;
  if (t == 0) {
    for (int k = 0; k < NPAGE; ++k) mbar_init(full + k, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    stop = 0;
    fail = 0;
  }
  __syncthreads();
  if (warp == NCW) {
    if (load && lane == 0) stream(weights, wbytes, load, full, smem, &stop);
    return;
  }
  float v = t < slice ? blockIdx.x + 0.25f * t : 0.f;   // this thread's value of the slice
  const long long t0 = globaltimer();
  for (int r = 0; r < rounds; ++r) {
    const int half = (r & 1) * n;
    float s = 0.f;
    if (flagged) {
      const unsigned long long tag = (unsigned long long)(r + 1) << 32;
      if (t < slice)
        asm volatile("st.relaxed.gpu.global.b64 [%0], %1;"
                     ::"l"(fbuf + half + blockIdx.x * slice + t), "l"(tag | __float_as_uint(v))
                     : "memory");
      unsigned long long w[MAXW];
      bool ok = false;
      for (int spins = 0; !ok && spins < SPINS; ++spins) {
        ok = true;
#pragma unroll
        for (int j = 0; j < MAXW; ++j) {
          const int i = t + j * NT;
          if (i < n) asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w[j])
                                  : "l"(fbuf + half + i) : "memory");
        }
#pragma unroll
        for (int j = 0; j < MAXW; ++j)
          if (t + j * NT < n) ok &= (w[j] >> 32) == (unsigned long long)(r + 1);
      }
      if (!ok) fail = 1;
#pragma unroll
      for (int j = 0; j < MAXW; ++j)
        if (t + j * NT < n) s += __uint_as_float((unsigned int)w[j]);
    } else {
      if (t < slice) buf[half + blockIdx.x * slice + t] = v;
      consumers_sync(NT);
      if (t == 0) {
        signal_counter(counter, 0);
        if (!wait_mode(counter, P * (r + 1), mode, error)) fail = 1;
      }
      consumers_sync(NT);
      for (int i = t; i < n; i += NT) s += __ldcg(buf + half + i);
    }
    s = block_sum(s, part, warp, lane);   // (its barriers also make `fail` the block's)
    if (fail) {
      if (t == 0) atomicExch(error, 1);
      break;
    }
    v = 0.5f * v + 0.5f * s / n + (float)((r + blockIdx.x) % 5);
  }
  const long long t1 = globaltimer();
  if (t < slice) out_v[blockIdx.x * slice + t] = v;
  if (t == 0) {
    out_t[blockIdx.x] = t1 - t0;
    stop = 1;
  }
}
"""


def reference(blocks: int, slice_: int, rounds: int) -> torch.Tensor:
    """The last round's vector in float64: in round r, v <- v / 2 + mean(v) / 2 + (r + b) % 5
    for the values of block b (a stale read changes the mean)."""
    b = torch.arange(blocks, dtype=torch.float64)[:, None]
    v = (b + 0.25 * torch.arange(slice_, dtype=torch.float64)[None, :])   # [blocks, slice]
    for r in range(rounds):
        v = 0.5 * v + 0.5 * v.mean() + (r + b) % 5
    return v.flatten()


PROTOCOLS = {"counter": (0, 0), "relaxed": (0, 1), "flagged": (1, 0)}   # (flagged, wait mode)


def run(driver, func, blocks: int, slice_: int, rounds: int, protocol: str, load: int,
        weights: torch.Tensor) -> float:
    """Microseconds a round (mean over blocks) of one launch; checks its last vector."""
    dev = weights.device
    n = blocks * slice_
    buf = torch.full((2 * n,), float("nan"), device=dev)
    fbuf = torch.zeros(2 * n, dtype=torch.int64, device=dev)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    error = torch.zeros(1, dtype=torch.int32, device=dev)
    out_t = torch.zeros(blocks, dtype=torch.int64, device=dev)
    out_v = torch.full((n,), float("nan"), device=dev)
    flagged, mode = PROTOCOLS[protocol]
    args = [ctypes.c_void_p(x.data_ptr()) for x in (buf, fbuf, counter, weights)]
    args += [ctypes.c_longlong(weights.numel()), ctypes.c_int(rounds), ctypes.c_int(slice_),
             ctypes.c_int(flagged), ctypes.c_int(mode), ctypes.c_int(load)]
    args += [ctypes.c_void_p(x.data_ptr()) for x in (out_t, out_v, error)]
    driver.launch(func, blocks, 9 * 32, SMEM, torch.cuda.current_stream().cuda_stream, args)
    torch.cuda.synchronize()
    if error.item():
        raise RuntimeError(f"a wait spun past its bound (slice {slice_}, {protocol})")
    ref = reference(blocks, slice_, rounds)
    err = ((out_v.double().cpu() - ref).norm() / ref.norm()).item()
    if not err < 1e-4:
        raise RuntimeError(f"wrong values (slice {slice_}, {protocol}): rel err {err}")
    return out_t.double().mean().item() / 1e3 / rounds


def main(argv=None) -> int:
    from megakernel.runtime.cuda_step import Driver, build_cubin

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", default="4,16,31", help="values a block writes a round")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--loads", default="0,2,8",
                    help="16 KB copies the producer keeps in flight (0: no weight stream)")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    args = ap.parse_args(argv)
    blocks = torch.cuda.get_device_properties(0).multi_processor_count
    slices = [int(s) for s in args.slices.split(",")]
    loads = [int(x) for x in args.loads.split(",")]
    protocols = args.protocols.split(",")
    if max(slices) * blocks > 16 * 256:
        raise SystemExit(f"a slice of at most {16 * 256 // blocks} values on {blocks} SMs")
    if not set(protocols) <= set(PROTOCOLS) or not all(0 <= x <= 8 for x in loads):
        raise SystemExit(f"protocols among {', '.join(PROTOCOLS)}; loads 0-8")
    weights = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    driver = Driver()
    func = driver.load(build_cubin(SOURCE), "hop", SMEM)
    for load in loads:
        for slice_ in slices:
            us = {p: [] for p in protocols}
            for _ in range(2):                       # alternating, twice
                for p in protocols:
                    us[p].append(run(driver, func, blocks, slice_, args.rounds, p, load, weights))
            print(f"load={load} slice={slice_:3d} us/round: " + ", ".join(
                f"{p} {a:.3f} {b:.3f}" for p, (a, b) in us.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
