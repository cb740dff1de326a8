// Attention's keys on tensor cores (MK_ATTN_MMA; see megakernel_attention.cuh): the key loop of
// an AttnPartial task whose keys and values come through the ring (KV_RING). Inputs: the
// task's q rows [G, D] and cache pages; output: each warp's (max, sum, acc) in the task's
// scratch, as AttnPartial::to_tmp lays them out, for its merge.
#pragma once
#include "megakernel_ctx.cuh"

#ifndef MK_ATTN_MMA
#define MK_ATTN_MMA 0    // keys through the ring scored and weighted on tensor cores (MmaKeys)
#endif

namespace mk {

// A: the AttnPartial whose pages (Pages, see, give, ring_row, ...) and cache layout it reads.
template <int D, int G, class A>
struct MmaKeys {
  // Tensor-core form (MMA_KEYS: keys and values from the ring's pages): each warp takes runs of
  // 16 keys, S [16 heads (G padded), 16 keys] = Q K^T by mma (K's rows by ldmatrix), the online
  // step on S's fragments, whose bf16 probabilities are the A fragments of O += P V (V's rows
  // by ldmatrix.trans). Lane (g, t) holds heads g and g + 8: of S keys 2t, 2t + 1 (+ 8), of O
  // dims 8j + 2t, + 1. The key at hi - 1 (the row's newest, not yet in a page) is masked there
  // and added by warp 0 from L2 at the end. Leaves the warps' (max, sum, acc) in tmp.
  template <class C>
  __device__ static void run(C& c, const bf16* qrow, const bf16* cache, const int* bt, int row,
                             int kv_head, int lo, int span, int hi, int layer, float scale) {
    constexpr int NCW = C::NT / 32, STEP = NCW * 16, DT = D / 8;
    const int g = c.lane / 4, t = c.lane % 4, end = lo + span;
    uint32_t qa[D / 16][4];   // Q's A fragments a k-step: rows g, g + 8; dims 2t (+1), 2t + 8 (+9)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int head = g + (r & 1) * 8, d = 16 * kk + 2 * t + (r >> 1) * 8;
        qa[kk][r] = head < G ? __ldcg(reinterpret_cast<const unsigned int*>(qrow + head * D + d))
                             : 0u;
      }
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
    typename A::Pages pg;
    for (int base = lo + c.warp * 16; base < end; base += STEP) {
      A::see(c, pg, A::pages_through(lo, min(base + 16, end) - 1));
      float sc[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kb[4];   // keys (lane / 16) * 8 + lane % 8, dims 16kk + ((lane / 8) % 2) * 8
        const int key = base + (c.lane / 16) * 8 + c.lane % 8;
        const bf16* kr = A::ring_row(c.ring, lo, key, 0, pg.gone);
        ldsm_x4(kb, reinterpret_cast<const unsigned char*>(kr + 16 * kk + (c.lane / 8) % 2 * 8));
        const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
        mma16816(sc[0], qa[kk], b0);
        mma16816(sc[1], qa[kk], b1);
      }
      uint32_t pa[4];   // P's A fragment: rows g, g + 8; keys 2t (+1), 2t + 8 (+9)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = base + 8 * j + 2 * t + e;
            float& v = sc[j][2 * h + e];
            v = key < hi - 1 ? v * scale : -INFINITY;
            mx = fmaxf(mx, v);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[h], mx);
        const float ref = max_ref(m_new);
        const float alpha = __expf(m[h] - ref);
        float psum = 0.f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float p0 = __expf(sc[j][2 * h] - ref), p1 = __expf(sc[j][2 * h + 1] - ref);
          psum += p0 + p1;
          const __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
          pa[2 * j + h] = *reinterpret_cast<const uint32_t*>(&pb);
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        psum += __shfl_xor_sync(0xffffffffu, psum, 2);
        l[h] = l[h] * alpha + psum;
        m[h] = m_new;
#pragma unroll
        for (int j = 0; j < DT; ++j) {
          o[j][2 * h] *= alpha;
          o[j][2 * h + 1] *= alpha;
        }
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t vb[4];   // keys ((lane / 8) % 2) * 8 + lane % 8, dims 16dp + (lane / 16) * 8
        const int key = base + (c.lane / 8) % 2 * 8 + c.lane % 8;
        const bf16* vr = A::ring_row(c.ring, lo, key, 1, pg.gone);
        ldsm_x4_t(vb, reinterpret_cast<const unsigned char*>(vr + 16 * dp + c.lane / 16 * 8));
#pragma unroll
        for (int r = 0; r < 4; ++r) {   // keys from hi - 1 on: zeros (the page may hold NaN)
          const int k0 = base + (r & 1) * 8 + 2 * t;
          vb[r] &= (k0 < hi - 1 ? 0xffffu : 0u) | (k0 + 1 < hi - 1 ? 0xffff0000u : 0u);
        }
        const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
        mma16816(o[2 * dp], pa, b0);
        mma16816(o[2 * dp + 1], pa, b1);
      }
      if (base + STEP < end) A::give(c, pg, A::pages_through(lo, base + STEP) - 2);
    }
    A::give(c, pg, A::ring_pages(lo, span));
    if (c.warp == 0 && hi - 1 >= lo)
      newest_key(c, qrow, cache, bt, row, kv_head, hi - 1, layer, scale, o, m, l);
    float* tm = c.tmp;   // AttnPartial::to_tmp's layout
    float* tl = tm + NCW * G;
    float* ta = tl + NCW * G;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = g + 8 * h;
      if (head >= G) continue;
      if (t == 0) {
        tm[c.warp * G + head] = m[h];
        tl[c.warp * G + head] = l[h];
      }
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        ta[(c.warp * G + head) * D + 8 * j + 2 * t] = o[j][2 * h];
        ta[(c.warp * G + head) * D + 8 * j + 2 * t + 1] = o[j][2 * h + 1];
      }
    }
  }
  // Key s (from L2) into one warp's `run` state: each quad's lane t scores dims
  // [t D / 4, (t + 1) D / 4) of heads g and g + 8.
  template <class C>
  __device__ static void newest_key(C& c, const bf16* qrow, const bf16* cache, const int* bt,
                                    int row, int kv_head, int s, int layer, float scale,
                                    float (&o)[D / 8][4], float (&m)[2], float (&l)[2]) {
    const int g = c.lane / 4, t = c.lane % 4;
    const bf16* kp = A::key_row(cache, bt, row, s, layer, kv_head);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = g + 8 * h;
      float dot = 0.f;
      if (head < G)
        for (int d = t * (D / 4); d < (t + 1) * (D / 4); ++d)
          dot = fmaf(load_act(qrow + head * D + d), load_act(kp + d), dot);
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      dot += __shfl_xor_sync(0xffffffffu, dot, 2);
      const float sc = head < G ? dot * scale : -INFINITY;
      const float m_new = fmaxf(m[h], sc);
      const float ref = max_ref(m_new);
      const float alpha = __expf(m[h] - ref), p = __expf(sc - ref), pr = round_bf16(p);
      l[h] = l[h] * alpha + p;
      m[h] = m_new;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = head < G ? load_act(kp + A::V_SHIFT + 8 * j + 2 * t + e) : 0.f;
          o[j][2 * h + e] = o[j][2 * h + e] * alpha + pr * v;
        }
    }
  }
};

}  // namespace mk
