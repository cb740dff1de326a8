// The consumer warps' side of a CUDA megakernel worker: the projection over weight pages and
// the block-wide helpers the op bodies (megakernel_ops.cuh) share.
//
// A projection task's weights arrive as SEGS segments of `rows` rows of K elements each, in
// pages of whole rows (megakernel_ring.cuh's PageRows: each row read by WPR warps). Each warp
// holds the part of x [B, K] (bf16, row-major) its 16-byte groups meet in registers, dots its
// part of a page's row with it, reduces the part across its lanes into acc [SEGS * rows, WPR, B]
// in shared memory and frees the page: no barrier a page; the parts are added in a fixed order
// after the last page (deterministic).
//
// MMA (from 5 batch rows on): the projection on tensor cores instead (megakernel_mma.cuh), x's
// chunks through XS stages at `xs` (XStages: tensor copies from maps of the activations).
#pragma once
#ifndef MK_PROBE
#define MK_PROBE 0   // a trace's end stamp at a mark of the task (1: a projection's first
                     // page reduced (tensor cores: landed), 2: its last, 3: the body done, 4:
                     // every warp's body done) instead of after its signal; 5 (timing only,
                     // results wrong): as 2 with the tensor-core products left out, the chunk
                     // loop's waits and frees alone
#endif
#include "megakernel_mma.cuh"

namespace mk {

// The reference an online softmax's running max m rescales to: m, or 0 where no key has come
// yet (m = -inf: its terms add nothing, and -inf - -inf would be NaN).
__device__ __forceinline__ float max_ref(float m) { return m == -INFINITY ? 0.f : m; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

// An activation written by another worker in this launch: read from L2, never a stale L1 line.
__device__ __forceinline__ float load_act(const bf16* p) {
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return __bfloat162float(__ushort_as_bfloat16(bits));
}

// A row RMS from the writers' sums of squares ss [SUMS, B]: each lane's share of the groups
// asked for before a task reads its weights (``sums_begin``), reduced across the warp after
// them (``rms_finish``): every thread then holds each row's 1 / sqrt(mean square + eps), with
// no shared memory or barrier, and the loads' latency hides behind the x loads'.
template <int B, int SUMS>
__device__ __forceinline__ void sums_begin(const float* ss, int lane, float (&part)[B]) {
#pragma unroll
  for (int b = 0; b < B; ++b) {
    part[b] = 0.f;
    if (ss != nullptr)
      for (int g = lane; g < SUMS; g += 32) part[b] += __ldcg(ss + g * B + b);
  }
}

template <int B>
__device__ __forceinline__ void rms_finish(float (&part)[B], int k, float eps) {
#pragma unroll
  for (int b = 0; b < B; ++b) part[b] = rsqrtf(warp_sum(part[b]) / k + eps);
}

// v[b] for a b known only at run time, without a local-memory array.
template <int B>
__device__ __forceinline__ float pick(const float (&v)[B], int b) {
  float r = v[0];
#pragma unroll
  for (int i = 1; i < B; ++i) r = i == b ? v[i] : r;
  return r;
}

template <int NCW_, int NPAGE, int PAGE, int B, bool MMA = false, int XS = 4>
struct Ctx {
  static constexpr int NCW = NCW_, PAGE_BYTES = PAGE;
  static constexpr int NT = NCW * 32;   // consumer threads
  Ring<NPAGE, PAGE> ring;
  float* acc;     // [rows, parts, B] a task's row parts
  float* tmp;     // scratch of the epilogues and of attention's merge
  float* rms;     // MMA: [B] the norm's row RMS of the last projection (``mma_normed``)
  unsigned char* xs;   // MMA: x's stages [XS, B padded to 16, 64], then their barriers
  int t, warp, lane;
  int parts = 1;  // MMA: parts a row of acc (the chunk groups of the last projection)
  bool drain = false;   // after a watchdog trip: consume pages, compute nothing
  int64_t probe_t = 0;  // MK_PROBE > 0 (traces only): when thread 0 passed mark MK_PROBE
  uint32_t xn = 0;      // MMA: x's chunks taken so far
  int task = 0;         // MK_CHUNK_LOG: the task being run (its index in the tables)
  WaitLog log;          // MK_CHUNK_LOG: a chunk's waits (lane 0 of warps 0 and NCW - 1)

  // MMA: x's barriers and maps (over the buffer at `base`) set up (thread 0, before the
  // launch's first barrier)
  static __device__ void init_x(unsigned char* xs, const CUtensorMap* maps, const bf16* base) {
    if constexpr (MMA) XStages<B, XS>::init(xs, NCW, maps, base);
  }

  __device__ void mark(int k) {
    if (MK_PROBE == k && t == 0) probe_t = globaltimer();
  }

  __device__ void sync() const { consumers_sync(NT); }

  // acc parts of x[b] . W_seg[r] for SEGS segments of `rows` rows (``result`` adds them). Each
  // warp reduces its row part of a page before freeing the page (freeing first and reducing
  // after: 0.873 against 0.809 ms, llama-3.2-1b, batch 1, H200).
  template <int K, int SEGS, int NMAX>
  __device__ void project(const bf16* x, int rows) {
    if constexpr (MMA) {
      parts = mma_project<Ctx, B, K, K, SEGS, NMAX, XS>(*this, x, 0, rows, [] {});
      mma_end();
    } else {
      project_cores<K, SEGS>(x, rows);
    }
  }

  // The MMA projection of x [B, XK]'s columns [k0, k0 + KS) (a K slice).
  template <int XK, int KS, int NMAX>
  __device__ void project_slice(const bf16* x, int k0, int rows) {
    static_assert(MMA, "K slices are built for tensor-core projections only");
    parts = mma_project<Ctx, B, XK, KS, 1, NMAX, XS>(*this, x, k0, rows, [] {});
    mma_end();
  }

  // After an MMA projection: every warp's parts in acc (and the probes' marks 2 and 5).
  __device__ void mma_end() {
    sync();
    mark(2);
    mark(5);
  }

  // The CUDA-core projection (below MMA's batch rows): x in registers.
  template <int K, int SEGS>
  __device__ void project_cores(const bf16* x, int rows) {
    typedef PageRows<K, PAGE, NCW> L;
    constexpr int XJ = (K / 8 + 32 * L::WPR - 1) / (32 * L::WPR);
    static_assert(K % 8 == 0, "rows must be whole 16-byte groups");
    const int rr = warp / L::WPR, part = warp % L::WPR;
    uint4 xr[B][XJ];
    if (!drain) load_x<K, XJ>(x, part, xr);
    for (int seg = 0; seg < SEGS; ++seg)
      for (int r0 = 0; r0 < rows; r0 += L::ROWS) {
        mbar_wait(ring.full + ring.slot, ring.phase);
        if (!drain && r0 + rr < rows) {
          float s[B];
          page_part<K, XJ>(xr, part, rr * (K / 8), s);
          float* out = acc + ((seg * rows + r0 + rr) * L::WPR + part) * B;
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const float v = warp_sum(s[b]);
            if (lane == 0) out[b] = v;
          }
          if (seg == 0 && r0 == 0) mark(1);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(ring.empty + ring.slot);
        ring.advance();
      }
    sync();
    mark(2);
  }

  // This warp's part of x [B, K] (16-byte groups part * 32 + lane + 32 * WPR * j) into registers.
  template <int K, int XJ>
  __device__ void load_x(const bf16* x, int part, uint4 (&xr)[B][XJ]) const {
    constexpr int KV = K / 8, WPR = PageRows<K, PAGE, NCW>::WPR;
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int j = 0; j < XJ; ++j) {
        const int v = part * 32 + lane + 32 * WPR * j;
        xr[b][j] = (v < KV) ? __ldcg(reinterpret_cast<const uint4*>(x + (int64_t)b * K) + v)
                            : make_uint4(0, 0, 0, 0);
      }
  }

  // Lane partials s[b] of this warp's part of the current page's row at element offset `off`
  // (16-byte groups) with x.
  template <int K, int XJ>
  __device__ void page_part(const uint4 (&xr)[B][XJ], int part, int off, float (&s)[B]) const {
    constexpr int KV = K / 8, WPR = PageRows<K, PAGE, NCW>::WPR;
    const uint4* pg = reinterpret_cast<const uint4*>(ring.page()) + off;
#pragma unroll
    for (int b = 0; b < B; ++b) s[b] = 0.f;
#pragma unroll
    for (int j = 0; j < XJ; ++j) {
      const int v = part * 32 + lane + 32 * WPR * j;
      if (KV % (32 * WPR) == 0 || v < KV) {
        const uint4 w = pg[v];
#pragma unroll
        for (int b = 0; b < B; ++b) s[b] += dot8(w, xr[b][j]);
      }
    }
  }

  // ``project`` with a norm's row RMS from the sums of squares ss around it (HAS_NORM): batch
  // row b's by ``row_rms(rs, b)`` in every thread after it (rs: the CUDA cores' copy).
  template <int K, int SEGS, bool HAS_NORM, int SUMS, int NMAX>
  __device__ void project_normed(const bf16* x, int rows, const float* ss, float eps,
                                 float (&rs)[B]) {
    if constexpr (MMA) {
      mma_normed<K, SEGS, HAS_NORM, SUMS, NMAX>(x, rows, ss, eps);
      return;
    }
    sums_begin<B, SUMS>(HAS_NORM && !drain ? ss : nullptr, lane, rs);
    project<K, SEGS, NMAX>(x, rows);
    if (HAS_NORM && !drain) rms_finish<B>(rs, K, eps);
  }

  // The MMA projection and the norm's row RMS in rms[0, B) (``row_rms``): warp w sums rows w,
  // w + NCW, ... of ss as ``sums_begin`` does, its loads issued once x's first chunks are asked
  // for (thread 0 waited for them before it asked: about an L2 latency more to its first chunk,
  // 2.9 us against 1.8 for a projection without a norm, H200, 17 rows), and writes their RMS
  // before the barrier that ends the projection.
  template <int K, int SEGS, bool HAS_NORM, int SUMS, int NMAX>
  __device__ void mma_normed(const bf16* x, int rows, const float* ss, float eps) {
    constexpr int RW = (B + NCW - 1) / NCW;    // rows a warp
    float part[RW];
    parts = mma_project<Ctx, B, K, K, SEGS, NMAX, XS>(*this, x, 0, rows, [&] {
#pragma unroll
      for (int j = 0; j < RW; ++j) {
        part[j] = 0.f;
        const int b = warp + j * NCW;
        if (HAS_NORM && !drain && b < B)
          for (int g = lane; g < SUMS; g += 32) part[j] += __ldcg(ss + g * B + b);
      }
    });
    if (HAS_NORM && !drain)
#pragma unroll
      for (int j = 0; j < RW; ++j) {
        const float v = rsqrtf(warp_sum(part[j]) / K + eps);
        if (lane == 0 && warp + j * NCW < B) rms[warp + j * NCW] = v;
      }
    mma_end();
  }

  // Batch row b's norm RMS after ``project_normed`` (rs: what it left in this thread).
  __device__ float row_rms(const float (&rs)[B], int b) const {
    if constexpr (MMA)
      return rms[b];
    else
      return pick(rs, b);
  }

  // Row i's product with x[b], after ``project``: its parts added in order.
  template <int K>
  __device__ float result(int i, int b) const {
    if constexpr (MMA) {
      float s = 0.f;
      for (int p = 0; p < parts; ++p) s += acc[(i * parts + p) * B + b];
      return s;
    } else {
      constexpr int WPR = PageRows<K, PAGE, NCW>::WPR;
      float s = 0.f;
#pragma unroll
      for (int p = 0; p < WPR; ++p) s += acc[(i * WPR + p) * B + b];
      return s;
    }
  }

  // ss[g * B + b] = sum over i < n of vals[b * n + i] (vals in shared memory), one warp a row.
  __device__ void row_sums(const float* vals, int n, float* ss, int g) {
    for (int b = warp; b < B; b += NCW) {
      float s = 0.f;
      for (int i = lane; i < n; i += 32) s += vals[b * n + i];
      s = warp_sum(s);
      if (lane == 0) ss[g * B + b] = s;
    }
  }
};

}  // namespace mk
