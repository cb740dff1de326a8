// The merge of attention partials (see megakernel_attention.cuh): AttnCombine, the combine
// task's body and the fused form's last piece's, and the ticket that picks that piece.
// Partials are fp32 acc [P, G, D] and (max, sum) [P, G, 2] as compiler/attention_ops.py lays
// them out; the output is bf16 [B, HQ, D].
#pragma once
#include "megakernel_ctx.cuh"

namespace mk {

// Whether this task takes the last of `total` tickets: every consumer's stores before it are
// released (the barrier, then a release atomic, acq_rel with MK_ACQUIRE_TICKET); the last
// taker reads the others' from L2 (``__ldcg``), only once it knows it is the last.
template <class C>
__device__ bool last_ticket(C& c, int* ticket, int total) {
  c.sync();
  int* flag = reinterpret_cast<int*>(c.tmp);
  if (c.t == 0) {
    int old;
    if (MK_ACQUIRE_TICKET)
      asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(ticket)
                   : "memory");
    else
      asm volatile("atom.release.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(ticket)
                   : "memory");
    *flag = old == total - 1;
  }
  c.sync();
  return *flag != 0;
}

// out = sum_s w_s acc_s / sum_s w_s l_s over partial slots [first, first + count), CH slots at
// a time: a chunk's loads all asked for at once (one L2 round trip a chunk), its max and
// weights from them, what earlier chunks added rescaled to the new max (0.877 ms against 0.884
// for a max pass, then a sum pass: llama-3.2-1b, batch 1, H200).
template <int HQ, int D, int G>
struct AttnCombine {
  static constexpr int CH = 8;
  template <class P>
  __device__ static void pages(P&, const float*, const float*, bf16*, int, int, int, int) {}
  // (also the merge of a fused unit's last piece, after its ticket)
  template <class C>
  __device__ static void run(C& c, const float* acc, const float* ml, bf16* out, int row,
                             int kv_head, int first, int count) {
    if (c.drain) return;
    for (int idx = c.t; idx < G * D; idx += C::NT) {
      const int g = idx / D, d = idx % D;
      float mx = -INFINITY, a = 0.f, den = 0.f;
      for (int s0 = 0; s0 < count; s0 += CH) {
        float ms[CH], ls[CH], as[CH];
#pragma unroll
        for (int k = 0; k < CH; ++k) {
          const int part = (first + s0 + k) * G + g;
          const bool ok = s0 + k < count;
          ms[k] = ok ? __ldcg(ml + part * 2) : -INFINITY;
          ls[k] = ok ? __ldcg(ml + part * 2 + 1) : 0.f;
          as[k] = ok ? __ldcg(acc + (int64_t)part * D + d) : 0.f;
        }
        float cm = mx;
#pragma unroll
        for (int k = 0; k < CH; ++k) cm = fmaxf(cm, ms[k]);
        const float ref = max_ref(cm);
        const float keep = mx == -INFINITY ? 0.f : __expf(mx - ref);
        a *= keep;
        den *= keep;
#pragma unroll
        for (int k = 0; k < CH; ++k) {
          const float wt = ms[k] == -INFINITY ? 0.f : __expf(ms[k] - ref);
          a += wt * as[k];
          den += wt * ls[k];
        }
        mx = cm;
      }
      out[((int64_t)row * HQ + kv_head * G + g) * D + d] =
          __float2bfloat16(a / (den == 0.f ? 1.f : den));
    }
  }
};

}  // namespace mk
