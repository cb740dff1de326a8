// The CUDA backend's persistent-loop primitives (templates/megakernel.cu.jinja): counter waits
// and signals, and the weight ring.
//
// A worker is one block of NCW consumer warps and one producer warp. The producer walks the
// worker's queue and copies each task's weight rows (nothing a task waits for; with kv_ring also
// attention's cache blocks) into a ring of NPAGE shared-memory pages with bulk copies, running
// ahead of the consumers by as many pages as the ring holds, across task boundaries and across
// the consumers' counter waits. The consumers wait for a task's input counters, run its body,
// reading pages in the order they were copied, and signal its counter. Invariants: both sides
// derive the same page sequence from the same instruction words (``pages`` and ``run`` of an op
// take the same arguments); a page holds whole weight rows (or one cache block's K or V); every
// page copied is consumed, also after a watchdog trip (consumers then drain pages without
// computing), so no copy is left in flight when a block exits.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef MK_ACQUIRE_POLLS
#define MK_ACQUIRE_POLLS 0   // a wait's polls: acquire atomics (1) or relaxed loads (0)
#endif
#ifndef MK_KV_AHEAD
#define MK_KV_AHEAD 0   // L2 prefetches of a task's cache held until the consumers are at most
                        // this many tasks behind it (0: never held)
#endif
#ifndef MK_ACQUIRE_TICKET
#define MK_ACQUIRE_TICKET 0  // the fused combine's ticket: an acq_rel (1) or release (0) atomic
#endif

namespace mk {

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

__device__ __forceinline__ void consumers_sync(int threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}

// ---- mbarriers and bulk copies (sm_90) ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_done(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return ok != 0;
}
// Waits for a ring barrier's phase. No wait of a working kernel comes near MK_RING_SPINS polls
// (a page lands within a memory latency; a page is freed within a counter wait, whose own
// watchdog drains the ring; 2^31 polls of a phase not yet complete take tens of seconds at
// the least): past it the barrier will never complete (a bug), and the launch stops with a
// trap (an unspecified launch failure on the host) instead of hanging for ever.
#ifndef MK_RING_SPINS
#define MK_RING_SPINS (1u << 31)
#endif
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  for (uint32_t spins = 0; !mbar_done(bar, parity);)
    if (++spins == MK_RING_SPINS) __trap();
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

// ---- counters ----
__device__ __forceinline__ int poll(const int* p) {
  int v;
  asm volatile("atom.acquire.gpu.global.add.s32 %0, [%1], 0;" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The first error of a launch: error [flag, task, counter, seen value].
__device__ __forceinline__ void record_error(int* error, int task, int c, int seen) {
  if (atomicCAS(error, 0, 1) == 0) {
    error[1] = task;
    error[2] = c;
    error[3] = seen;
  }
}

__device__ __forceinline__ int load_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Polls *p until it holds at least `need`; the last value seen (below need after `limit` polls,
// or once another worker has recorded an error). ACQ (MK_ACQUIRE_POLLS unless given): acquire
// atomics (in SASS an ATOMG, then CCTL.IVALL, an L1 invalidate a poll); else relaxed loads, with
// no invalidate: what a counter guards is read from L2 (``__ldcg``, ``load_act``) and only once
// the poll's value is known (a branch on it, then a barrier).
template <bool ACQ = (MK_ACQUIRE_POLLS != 0)>
__device__ __forceinline__ int poll_until(const int* p, int need, int limit, const int* error) {
  int seen = ACQ ? poll(p) : load_relaxed(p);
  for (int spins = 0; seen < need && spins < limit;) {
    seen = ACQ ? poll(p) : load_relaxed(p);
    if ((++spins & 1023) == 0 && *(volatile const int*)error != 0) break;
  }
  return seen;
}

// Wait until counters[c] >= size * epoch for each (c, size) of the task's waits (the first
// inline); false after a spin past spin_limit, or once another worker has recorded an error.
__device__ bool wait_counters(const int* waits, int* counters, int* error, int first, int count,
                              int c0, int size0, int epoch, int spin_limit, int task) {
  for (int j = 0; j < count; ++j) {
    const int c = j ? __ldg(waits + 2 * (first + j)) : c0;
    const int need = (j ? __ldg(waits + 2 * (first + j) + 1) : size0) * epoch;
    const int seen = poll_until(counters + c, need, spin_limit, error);
    if (seen < need) {
      record_error(error, task, c, seen);
      return false;
    }
  }
  return true;   // the polls order this thread, and the barrier after it the others' reads
                 // (each from L2: ``__ldcg``), after the producers' writes
}

// Release: called by one thread after every consumer's stores of the task (consumers_sync).
__device__ __forceinline__ void signal_counter(int* counters, int c) {
  if (c >= 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(counters + c) : "memory");
}

__device__ __forceinline__ int64_t globaltimer() {
  int64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A trace's log of one thread's waits (MK_CHUNK_LOG entries of LOG_WORDS int64 at p: a tag,
// then stamps), where p is set (traces only): what a tensor-core chunk or a ring page waited
// for, read by ``runtime.trace.chunk_log``.
#ifndef MK_CHUNK_LOG
#define MK_CHUNK_LOG 0
#endif
constexpr int LOG_WORDS = 6;
struct WaitLog {
  int64_t* p = nullptr;
  int n = 0;
  __device__ __forceinline__ void add(int64_t tag, int64_t a, int64_t b, int64_t c,
                                      int64_t d, int64_t e) {
    if (MK_CHUNK_LOG == 0 || p == nullptr || n >= MK_CHUNK_LOG) return;
    int64_t* w = p + LOG_WORDS * n++;
    w[0] = tag, w[1] = a, w[2] = b, w[3] = c, w[4] = d, w[5] = e;
  }
};
// This block's log of `stream` (0 consumer warp 0, 1 consumer warp NCW - 1, 2 the producer) in
// a buffer of three streams a block from `base` (``runtime.trace.wait_entries`` reads them).
__device__ __forceinline__ int64_t* wait_log_at(int64_t* base, int stream) {
  return base + (3 * blockIdx.x + stream) * MK_CHUNK_LOG * LOG_WORDS;
}

// ---- the weight ring ----
// Shared state of one worker: NPAGE pages of PAGE bytes, a full and an empty barrier a page.
template <int NPAGE, int PAGE>
struct Ring {
  unsigned char* pages;
  uint64_t* full;    // [NPAGE] producer -> consumers: the page's bytes landed
  uint64_t* empty;   // [NPAGE] consumers -> producer: every consumer warp has read it
  uint32_t slot = 0, phase = 0;

  __device__ void advance() {
    if (++slot == NPAGE) {
      slot = 0;
      phase ^= 1;
    }
  }
  __device__ unsigned char* page() const { return pages + (size_t)slot * PAGE; }
  // the page k places ahead, and its full barrier's parity
  __device__ unsigned char* page_at(int k) const {
    return pages + (size_t)((slot + k) % NPAGE) * PAGE;
  }
  __device__ uint64_t* full_at(int k) const { return full + (slot + k) % NPAGE; }
  __device__ uint64_t* empty_at(int k) const { return empty + (slot + k) % NPAGE; }
  __device__ uint32_t phase_at(int k) const { return phase ^ (((slot + k) / NPAGE) & 1); }
};

// How a weight matrix of row length K lies in the ring: ROWS whole rows a page (a power of two
// up to NCW), each read by WPR = NCW / ROWS consumer warps, warp w taking row w / WPR's part
// w % WPR (16-byte groups part * 32 + lane + 32 * WPR * j).
template <int K, int PAGE, int NCW>
struct PageRows {
  static constexpr int fit = PAGE / (2 * K);
  static constexpr int ROWS = fit >= 8 && NCW >= 8 ? 8 : fit >= 4 && NCW >= 4 ? 4
                              : fit >= 2 && NCW >= 2 ? 2 : 1;
  static constexpr int WPR = NCW / ROWS;
  static_assert(fit >= 1, "a weight row is longer than a ring page");
  static_assert(NCW % ROWS == 0, "page rows must divide the consumer warps");
};

// The producer's side: copy `rows` rows of K bf16 elements from `src` into the next pages,
// with at most FLIGHT copies issued and not yet landed (the ring may hold more landed pages):
// every byte in flight lengthens the queue that the consumers' own loads wait in. FLIGHT_BYTES
// (> 0): also at most that many bytes issued and not landed (pages of unequal fill).
template <int NPAGE, int PAGE, int NCW, int FLIGHT, int FLIGHT_BYTES = 0>
struct Producer {
  static constexpr int PAGE_BYTES = PAGE;
  Ring<NPAGE, PAGE> ring;
  uint32_t issued = 0;
  uint32_t landed = 0, pending = 0;    // FLIGHT_BYTES: pages known landed, bytes not
  uint32_t sizes[FLIGHT_BYTES ? NPAGE : 1];
  const volatile int* progress = nullptr;   // the consumers' task (MK_KV_AHEAD)
  int task = 0;                             // the task whose pages are being copied
  WaitLog log;                              // MK_CHUNK_LOG: a page's waits
  int first = 0;                            // MK_CHUNK_LOG: the worker's first instruction

  template <int K>
  __device__ void stream(const bf16* src, int rows) {
    constexpr int R = PageRows<K, PAGE, NCW>::ROWS;
    for (int r0 = 0; r0 < rows; r0 += R)
      page(src + (int64_t)r0 * K, (uint32_t)min(R, rows - r0) * K * 2);
  }
  // Held until the consumers are at most MK_KV_AHEAD tasks behind this one: prefetches into
  // L2 that run far ahead of their reader are evicted before it comes (many attention tasks).
  __device__ void hold_prefetch() const {
    if (MK_KV_AHEAD > 0 && progress != nullptr)
      while (*progress < task - MK_KV_AHEAD) __nanosleep(64);
  }
  // `bytes` (a multiple of 16) from `src` into L2, no page taken, nothing waited for.
  __device__ void prefetch_l2(const void* src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
  }
  // `bytes` (at most PAGE, a multiple of 16) from `src` into the next page.
  __device__ void page(const void* src, uint32_t bytes) {
    bulk_copy(begin_page(bytes), src, bytes, ring.full + ring.slot);
    ring.advance();
  }
  // The next page, free and told to expect `bytes`, for the caller's copies (its full barrier
  // ring.full + ring.slot); the caller advances the ring after them.
  __device__ unsigned char* begin_page(uint32_t bytes) {
    const int64_t t0 = MK_CHUNK_LOG ? globaltimer() : 0;
    if (FLIGHT < NPAGE && issued >= FLIGHT) {     // the copy FLIGHT places back has landed
      const uint32_t old = issued - FLIGHT;
      mbar_wait(ring.full + old % NPAGE, (old / NPAGE) & 1);
    }
    if (FLIGHT_BYTES) {   // (and never a ring behind: a slot's barrier then holds that page)
      while (landed < issued && (pending + bytes > (uint32_t)FLIGHT_BYTES ||
                                 issued - landed >= (uint32_t)NPAGE)) {
        mbar_wait(ring.full + landed % NPAGE, (landed / NPAGE) & 1);
        pending -= sizes[landed++ % NPAGE];
      }
      sizes[issued % NPAGE] = bytes;
      pending += bytes;
    }
    ++issued;
    const int64_t t1 = MK_CHUNK_LOG ? globaltimer() : 0;
    mbar_wait(ring.empty + ring.slot, ring.phase ^ 1);
    if (MK_CHUNK_LOG)
      log.add(((int64_t)(first + task) << 32) | bytes, t0, t1, globaltimer(), 0, 0);
    mbar_expect(ring.full + ring.slot, bytes);
    return ring.page();
  }
};

}  // namespace mk
