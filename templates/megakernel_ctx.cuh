// The consumer warps' side of a CUDA megakernel worker: the projection over weight pages and
// the block-wide helpers the op bodies (megakernel_ops.cuh) share.
//
// A projection task's weights arrive as SEGS segments of `rows` rows of K elements each, in
// pages of whole rows (megakernel_ring.cuh). x [B, K] (bf16, row-major) is held in registers,
// thread t owning the 16-byte column groups t, t + NT, ...; each page's row sums are reduced
// across the warps in a fixed order (deterministic) into acc [SEGS * rows, B] in shared memory.
#pragma once
#include "megakernel_ring.cuh"

namespace mk {

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

template <int NCW, int NPAGE, int PAGE, int B, int PART>
struct Ctx {
  static constexpr int NT = NCW * 32;   // consumer threads
  Ring<NPAGE, PAGE> ring;
  float* part;    // [2][NCW][PART] per-warp row sums of a page, by page parity
  float* acc;     // [rows, B] a task's row results
  float* tmp;     // scratch of the epilogues and of attention's merge
  float* vec;     // [B] each batch row's RMS factor
  int t, warp, lane;
  int half = 0;
  bool drain = false;   // after a watchdog trip: consume pages, compute nothing

  __device__ void sync() const { consumers_sync(NT); }

  // acc[(seg * rows + r) * B + b] = x[b] . W_seg[r] for SEGS segments of `rows` rows.
  template <int K, int SEGS>
  __device__ void project(const bf16* x, int rows) {
    constexpr int R = PageRows<K, PAGE>::value;
    constexpr int KV = K / 8;                    // 16-byte groups a row
    constexpr int XV = (KV + NT - 1) / NT;
    static_assert(K % 8 == 0, "rows must be whole 16-byte groups");
    static_assert(R * B <= PART, "page rows exceed the reduction scratch");
    uint4 xr[B][XV];
    if (!drain) {
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int j = 0; j < XV; ++j) {
          const int v = t + NT * j;
          xr[b][j] = (v < KV) ? __ldcg(reinterpret_cast<const uint4*>(x + (int64_t)b * K) + v)
                              : make_uint4(0, 0, 0, 0);
        }
    }
    for (int seg = 0; seg < SEGS; ++seg)
      for (int r0 = 0; r0 < rows; r0 += R) {
        const int n = min(R, rows - r0);
        mbar_wait(ring.full + ring.slot, ring.phase);
        float s[R][B];
        if (!drain) {
          const uint4* pg = reinterpret_cast<const uint4*>(ring.page());
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int b = 0; b < B; ++b) s[r][b] = 0.f;
            if (r < n)
#pragma unroll
              for (int j = 0; j < XV; ++j) {
                const int v = t + NT * j;
                if (v < KV) {
                  const uint4 w = pg[r * KV + v];
#pragma unroll
                  for (int b = 0; b < B; ++b) s[r][b] += dot8(w, xr[b][j]);
                }
              }
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(ring.empty + ring.slot);
        ring.advance();
        if (drain) continue;
        float* p = part + half * NCW * PART;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const float v = warp_sum(s[r][b]);
            if (lane == 0) p[warp * PART + r * B + b] = v;
          }
        sync();
        if (t < n * B) {
          float sum = 0.f;
          for (int w = 0; w < NCW; ++w) sum += p[w * PART + t];
          acc[(seg * rows + r0) * B + t] = sum;
        }
        half ^= 1;
      }
    sync();
  }

  // vec[b] = 1 / sqrt(sum of the SUMS groups' sums of squares of row b / K + eps)
  template <int K, int SUMS>
  __device__ void rstd_from_sums(const float* ss, float eps) {
    for (int b = warp; b < B; b += NCW) {
      float s = 0.f;
      for (int g = lane; g < SUMS; g += 32) s += __ldcg(ss + g * B + b);
      s = warp_sum(s);
      if (lane == 0) vec[b] = rsqrtf(s / K + eps);
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
