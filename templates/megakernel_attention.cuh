// Attention op bodies of the CUDA backend (see megakernel_ops.cuh): a partial over one key range
// of one row's G query heads of a kv head, and the combine of partials. Partials are fp32
// acc [P, G, D] and (max, sum) [P, G, 2] as compiler/attention_ops.py lays them out.
#pragma once
#include "megakernel_ctx.cuh"

namespace mk {

// Keys [lo, min(lo + span, len)) of row `row`: each warp takes every NCW-th key, lane l dims
// [l * DL, (l + 1) * DL) (those below D); the warps' (max, sum, acc) are merged in a fixed order. Probabilities
// are rounded to bf16 before they weight the values, as the Triton body's dot takes them.
template <int B, int HQ, int HKV, int S, int D, int G, int BS, bool DIRECT>
struct AttnPartial {
  static constexpr int DL = (D + 31) / 32;
  static_assert(DL <= 8, "head dims of at most 256");
  __device__ static bool has(int lane, int d) { return lane * DL + d < D; }
  // a lane's DL dims of a cache row (from L2), in 4-byte pairs where DL is even
  __device__ static void load_dims(const bf16* p, int lane, float (&out)[DL]) {
    if (DL % 2 == 0 && D % 64 == 0) {
#pragma unroll
      for (int d = 0; d < DL; d += 2) {
        const unsigned int bits = __ldcg(reinterpret_cast<const unsigned int*>(p + d));
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
        out[d] = f.x;
        out[d + 1] = f.y;
      }
    } else {
#pragma unroll
      for (int d = 0; d < DL; ++d) out[d] = has(lane, d) ? load_act(p + d) : 0.f;
    }
  }
  template <class P>
  __device__ static void pages(P&, const bf16*, const bf16*, const int64_t*, const int*, float*,
                               float*, bf16*, int, int, int, int, int, int, float) {}
  template <class C>
  __device__ static void run(C& c, const bf16* q, const bf16* cache, const int64_t* positions,
                             const int* bt, float* acc_out, float* ml, bf16* out, int row,
                             int kv_head, int slot, int lo, int span, int layer, float scale) {
    if (c.drain) return;
    constexpr int NCW = C::NT / 32;
    const int hi = min(lo + span, (int)positions[row] + 1);
    float qf[G][DL], acc[G][DL], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.f;
#pragma unroll
      for (int d = 0; d < DL; ++d) {
        qf[g][d] = has(c.lane, d)
            ? load_act(q + (int64_t)row * HQ * D + (kv_head * G + g) * D + c.lane * DL + d) : 0.f;
        acc[g][d] = 0.f;
      }
    }
    const int64_t v_shift = (int64_t)B * HKV * S * D;
    constexpr int U = DL >= 8 ? 4 : DL >= 2 ? 32 / DL : 16;   // keys a warp has in flight
    for (int s0 = lo + c.warp; s0 < lo + span; s0 += NCW * U) {
      float k[U][DL], v[U][DL], sc[U][G];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        // the loads do not wait for hi (the row's length, itself a load): every position below
        // S names a cache block; keys from hi on are read, then dropped
        const int s = s0 + u * NCW;
        const bf16* kp = cache + c.lane * DL +
                         cache_slot<B, HKV, S, D, BS>(bt, row, min(s, S - 1), layer, 0, kv_head);
        float kd[DL], vd[DL];
        load_dims(kp, c.lane, kd);
        load_dims(kp + v_shift, c.lane, vd);
#pragma unroll
        for (int d = 0; d < DL; ++d) {
          k[u][d] = s < hi ? kd[d] : 0.f;
          v[u][d] = s < hi ? vd[d] : 0.f;
        }
      }
      // every key's scores first (independent warp sums, no branch between them), then one
      // online step over the chunk, as the Triton body takes a chunk of keys at once
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float dot = 0.f;
#pragma unroll
          for (int d = 0; d < DL; ++d) dot = fmaf(qf[g][d], k[u][d], dot);
          dot = warp_sum(dot) * scale;
          sc[u][g] = s0 + u * NCW < hi ? dot : -INFINITY;
        }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float m_new = m[g];
#pragma unroll
        for (int u = 0; u < U; ++u) m_new = fmaxf(m_new, sc[u][g]);
        const float ref = m_new == -INFINITY ? 0.f : m_new;     // no key yet: adds nothing
        const float alpha = __expf(m[g] - ref);
        float psum = 0.f;
#pragma unroll
        for (int d = 0; d < DL; ++d) acc[g][d] *= alpha;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const float p = __expf(sc[u][g] - ref);
          psum += p;
          const float pr = round_bf16(p);
#pragma unroll
          for (int d = 0; d < DL; ++d) acc[g][d] = fmaf(pr, v[u][d], acc[g][d]);
        }
        l[g] = l[g] * alpha + psum;
        m[g] = m_new;
      }
    }
    // merge the warps: tmp [NCW][G] max, [NCW][G] sum, [NCW][G][D] acc
    float* tm = c.tmp;
    float* tl = tm + NCW * G;
    float* ta = tl + NCW * G;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (c.lane == 0) {
        tm[c.warp * G + g] = m[g];
        tl[c.warp * G + g] = l[g];
      }
#pragma unroll
      for (int d = 0; d < DL; ++d)
        if (has(c.lane, d)) ta[(c.warp * G + g) * D + c.lane * DL + d] = acc[g][d];
    }
    c.sync();
    for (int idx = c.t; idx < G * D; idx += C::NT) {
      const int g = idx / D, d = idx % D;
      float mx = -INFINITY;
      for (int w = 0; w < NCW; ++w) mx = fmaxf(mx, tm[w * G + g]);
      const float ref = mx == -INFINITY ? 0.f : mx;
      float a = 0.f, den = 0.f;
      for (int w = 0; w < NCW; ++w) {
        const float wt = tm[w * G + g] == -INFINITY ? 0.f : __expf(tm[w * G + g] - ref);
        a += wt * ta[(w * G + g) * D + d];
        den += wt * tl[w * G + g];
      }
      if (DIRECT) {
        out[((int64_t)row * HQ + kv_head * G + g) * D + d] =
            __float2bfloat16(a / (den == 0.f ? 1.f : den));
      } else {
        acc_out[((int64_t)slot * G + g) * D + d] = a;
        if (d == 0) {
          ml[(slot * G + g) * 2] = mx;
          ml[(slot * G + g) * 2 + 1] = den;
        }
      }
    }
  }
};

// out = sum_s w_s acc_s / sum_s w_s l_s over partial slots [first, first + count).
template <int HQ, int D, int G>
struct AttnCombine {
  template <class P>
  __device__ static void pages(P&, const float*, const float*, bf16*, int, int, int, int) {}
  template <class C>
  __device__ static void run(C& c, const float* acc, const float* ml, bf16* out, int row,
                             int kv_head, int first, int count) {
    if (c.drain) return;
    for (int idx = c.t; idx < G * D; idx += C::NT) {
      const int g = idx / D, d = idx % D;
      float mx = -INFINITY;
      for (int s = 0; s < count; ++s) mx = fmaxf(mx, __ldcg(ml + ((first + s) * G + g) * 2));
      const float ref = mx == -INFINITY ? 0.f : mx;
      float a = 0.f, den = 0.f;
      for (int s = 0; s < count; ++s) {
        const int part = (first + s) * G + g;
        const float ms = __ldcg(ml + part * 2);
        const float wt = ms == -INFINITY ? 0.f : __expf(ms - ref);
        a += wt * __ldcg(acc + (int64_t)part * D + d);
        den += wt * __ldcg(ml + part * 2 + 1);
      }
      out[((int64_t)row * HQ + kv_head * G + g) * D + d] =
          __float2bfloat16(a / (den == 0.f ? 1.f : den));
    }
  }
};

}  // namespace mk
