// Op bodies of the CUDA backend, one struct a task kind of compiler/registry.py, taking that
// kind's fields in the registry's order (kernel fields by name; staging's `copy`/`STAGE` left
// out) after the worker's producer (`pages`) or consumer context (`run`). `pages` copies the
// weight rows the task reads into the ring; `run` computes the task as the Triton body of the
// same kind does (compiler/ops.py, attention_ops.py), rounding to bf16 where it rounds.
// Shapes: activations row-major [B, N]; the cache [L, 2, B, Hkv, S, D] through the block table.
#pragma once
#include "megakernel_ctx.cuh"

namespace mk {

// Element offset of cache[layer, kv, row, head, pos, 0] through the block table.
template <int B, int HKV, int S, int D, int BS>
__device__ __forceinline__ int64_t cache_slot(const int* bt, int row, int pos, int layer, int kv,
                                               int head) {
  constexpr int NBPR = S / BS;
  const int block = __ldg(bt + row * NBPR + pos / BS);
  const int64_t plane = ((int64_t)(layer * 2 + kv) * B + block / NBPR) * HKV + head;
  return (plane * S + (block % NBPR) * BS + pos % BS) * D;
}

template <int B, int H, int BLOCK_N, bool SUMS>
struct Embed {
  template <class P>
  __device__ static void pages(P&, const int64_t*, const bf16*, bf16*, float*, const bf16*, bf16*,
                               int) {}
  template <class C>
  __device__ static void run(C& c, const int64_t* tokens, const bf16* table, bf16* out, float* ss,
                             const bf16* nw, bf16* sc, int n0) {
    if (c.drain) return;
    for (int idx = c.t; idx < B * BLOCK_N; idx += C::NT) {
      const int b = idx / BLOCK_N, n = n0 + idx % BLOCK_N;
      float v = 0.f;
      if (n < H) {
        const bf16 e = table[tokens[b] * H + n];
        out[b * H + n] = e;
        v = __bfloat162float(e);
        if (SUMS) sc[b * H + n] = __float2bfloat16(v * __bfloat162float(nw[n]));
      }
      if (SUMS) c.tmp[idx] = v * v;
    }
    if (SUMS) {
      c.sync();
      c.row_sums(c.tmp, BLOCK_N, ss, n0 / BLOCK_N);
    }
  }
};

// out[:, n0:n1] = [res +] [RMS] x @ W[n0:n1]^T; the norm's RMS from sums of squares (x scaled by
// the norm's weight already); OUT_SUMS: the next norm's sums and scaled copy of out's columns.
template <int B, int K, int N, bool HAS_NORM, bool HAS_RES, bool OUT_SUMS, int SUMS, int BLOCK_N>
struct Linear {
  static_assert(!HAS_NORM || SUMS > 0, "a norm inside the projection loop is not built");
  template <class P>
  __device__ static void pages(P& p, const bf16*, const bf16* w, const bf16*, const bf16*, bf16*,
                               const float*, float*, const bf16*, bf16*, int n0, int n1, int,
                               float) {
    p.template project<K, 1>({w + (int64_t)n0 * K}, n1 - n0);
  }
  template <class C>
  __device__ static void run(C& c, const bf16* x, const bf16* w, const bf16* nw, const bf16* res,
                             bf16* out, const float* ss, float* os, const bf16* onw, bf16* osc,
                             int n0, int n1, int g, float eps) {
    const int n = n1 - n0;
    // the residual asked for before the weights are read (one latency less after them)
    const bool early = !c.drain && c.t < n * B;
    const float r = HAS_RES && early ? load_act(res + (c.t / n) * N + n0 + c.t % n) : 0.f;
    const float onw0 = OUT_SUMS && early ? __bfloat162float(onw[n0 + c.t % n]) : 0.f;
    float rs[B];
    c.template project_normed<K, 1, HAS_NORM, SUMS, BLOCK_N>(x, n, ss, eps, rs);
    if (c.drain) return;
    // one row of at most 32 columns: its sum of squares within warp 0, no barrier
    const bool in_warp = B == 1 && n <= 32;
    float sq = 0.f;
    for (int idx = c.t; idx < n * B; idx += C::NT) {
      const int b = idx / n, i = idx % n, col = n0 + i;
      float y = c.template result<K>(i, b);
      if (HAS_NORM) y *= c.row_rms(rs, b);
      y = round_bf16(y);
      if (HAS_RES) y += idx == c.t ? r : load_act(res + b * N + col);
      const bf16 yo = __float2bfloat16(y);
      out[b * N + col] = yo;
      if (OUT_SUMS) {
        const float yr = __bfloat162float(yo);
        if (in_warp)
          sq = yr * yr;
        else
          c.tmp[b * n + i] = yr * yr;
        const float nwc = idx == c.t ? onw0 : __bfloat162float(onw[col]);
        osc[b * N + col] = __float2bfloat16(yr * nwc);
      }
    }
    if (OUT_SUMS && in_warp) {
      if (c.warp == 0) {        // the lanes row_sums would sum, in its order
        const float v = warp_sum(sq);
        if (c.lane == 0) os[g] = v;
      }
    } else if (OUT_SUMS) {
      c.sync();
      c.row_sums(c.tmp, n, os, g);
    }
  }
};

// out[:, n0:n1] = SiLU(RMS x @ Wg[n0:n1]^T) * (RMS x @ Wu[n0:n1]^T)
template <int B, int K, int N, bool HAS_NORM, int SUMS, int BLOCK_N>
struct GateUp {
  static_assert(!HAS_NORM || SUMS > 0, "a norm inside the projection loop is not built");
  template <class P>
  __device__ static void pages(P& p, const bf16*, const bf16*, const bf16* wg, const bf16* wu,
                               bf16*, const float*, int n0, int n1, float) {
    p.template project<K, 2>({wg + (int64_t)n0 * K, wu + (int64_t)n0 * K}, n1 - n0);
  }
  template <class C>
  __device__ static void run(C& c, const bf16* x, const bf16* nw, const bf16* wg, const bf16* wu,
                             bf16* out, const float* ss, int n0, int n1, float eps) {
    const int n = n1 - n0;
    float rs[B];
    c.template project_normed<K, 2, HAS_NORM, SUMS, BLOCK_N>(x, n, ss, eps, rs);
    if (c.drain) return;
    for (int idx = c.t; idx < n * B; idx += C::NT) {
      const int b = idx / n, i = idx % n;
      const float r = HAS_NORM ? c.row_rms(rs, b) : 1.f;
      const float g = round_bf16(c.template result<K>(i, b) * r);
      const float act = round_bf16(g / (1.f + expf(-g)));
      const float u = round_bf16(c.template result<K>(n + i, b) * r);
      out[b * N + n0 + i] = __float2bfloat16(act * u);
    }
  }
};

// Dims [d0, d0 + PART) of each half of one head of Q (kind 0), K (1) or V (2): RMS x @ W^T,
// RoPE for Q and K; Q into out [B, OUT_COLS] from column col, K and V into the cache.
template <int B, int K, int D, int HQ, int HKV, int S, int BS, int PART, int OUT_COLS,
          bool HAS_NORM, int SUMS>
struct QkvRope {
  static_assert(!HAS_NORM || SUMS > 0, "a norm inside the projection loop is not built");
  static constexpr int D2 = D / 2;
  __device__ static int pieces(int d0) { return min(d0 + PART, D2) - d0; }
  template <class P>
  __device__ static void pages(P& p, const bf16*, const bf16*, const bf16* w, const bf16*,
                               const float*, const int64_t*, const int*, bf16*, bf16*,
                               const float*, int, int head, int, int d0, int, float) {
    const int end = pieces(d0);
    p.template project<K, 2>({w + (int64_t)(head * D + d0) * K, w + (int64_t)(head * D + D2 + d0) * K},
                             end);
  }
  template <class C>
  __device__ static void run(C& c, const bf16* x, const bf16* nw, const bf16* w, const bf16* hn,
                             const float* inv, const int64_t* positions, const int* bt,
                             bf16* out, bf16* cache, const float* ss, int kind, int head,
                             int layer, int d0, int col, float eps) {
    const int end = pieces(d0);
    // each thread's first row: its position, frequency and cache block asked for before the
    // weights are read (dependent loads that would otherwise follow them)
    const bool early = !c.drain && c.t < end * B;
    const int pos0 = early ? (int)positions[c.t / end] : 0;
    const float inv0 = early ? inv[(d0 + c.t % end) % D2] : 0.f;
    const int64_t slot0 = early && kind > 0
        ? cache_slot<B, HKV, S, D, BS>(bt, c.t / end, pos0, layer, kind - 1, head) : 0;
    float rs[B];
    c.template project_normed<K, 2, HAS_NORM, SUMS, PART>(x, end, ss, eps, rs);
    if (c.drain) return;
    for (int idx = c.t; idx < end * B; idx += C::NT) {
      const int b = idx / end, i = idx % end;
      const float r = HAS_NORM ? c.row_rms(rs, b) : 1.f;
      float lo = round_bf16(c.template result<K>(i, b) * r);
      float hi = round_bf16(c.template result<K>(end + i, b) * r);
      const bool first = idx == c.t;
      const int pos = first ? pos0 : (int)positions[b];
      if (kind < 2) {
        const float f = (float)pos * (first ? inv0 : inv[(d0 + i) % D2]);
        const float cs = round_bf16(cosf(f)), sn = round_bf16(sinf(f));
        const float l2 = round_bf16(round_bf16(lo * cs) + round_bf16(-hi * sn));
        hi = round_bf16(round_bf16(hi * cs) + round_bf16(lo * sn));
        lo = l2;
      }
      bf16* dst = kind == 0 ? out + b * OUT_COLS + col
                  : cache + (first ? slot0
                                   : cache_slot<B, HKV, S, D, BS>(bt, b, pos, layer, kind - 1, head));
      dst[d0 + i] = __float2bfloat16(lo);
      dst[d0 + i + D2] = __float2bfloat16(hi);
    }
  }
};

// part[s, :, n0:n1] = x[:, k0:k0 + KS] @ W[n0:n1, k0:k0 + KS]^T in fp32 (tensor cores only)
template <int B, int K, int KS, int N, int BLOCK_N>
struct LinearPart {
  template <class P>
  __device__ static void pages(P& p, const bf16*, const bf16* w, float*, int n0, int n1, int k0,
                               int) {
    p.template slice<K, KS>(w + (int64_t)n0 * K, n1 - n0, k0);
  }
  template <class C>
  __device__ static void run(C& c, const bf16* x, const bf16*, float* part, int n0, int n1,
                             int k0, int s) {
    const int n = n1 - n0;
    c.template project_slice<K, KS, BLOCK_N>(x, k0, n);
    if (c.drain) return;
    float* dst = part + (int64_t)s * B * N + n0;
    for (int idx = c.t; idx < n * B; idx += C::NT)
      dst[(idx / n) * N + idx % n] = c.template result<K>(idx % n, idx / n);
  }
};

// out[:, n0:n1] = [res +] round(sum over s of part[s, :, n0:n1]) (slices in order); SUMS: the
// next norm's sums of squares and scaled copy of those columns (as Linear's OUT_SUMS).
template <int S, int B, int N, bool HAS_RES, int BLOCK_N, bool SUMS>
struct LinearReduce {
  template <class P>
  __device__ static void pages(P&, const float*, const bf16*, bf16*, float*, const bf16*, bf16*,
                               int, int) {}
  template <class C>
  __device__ static void run(C& c, const float* part, const bf16* res, bf16* out, float* ss,
                             const bf16* nw, bf16* sc, int n0, int n1) {
    if (c.drain) return;
    const int n = n1 - n0;
    for (int idx = c.t; idx < n * B; idx += C::NT) {
      const int b = idx / n, i = idx % n, col = n0 + i;
      float y = 0.f;
#pragma unroll
      for (int s = 0; s < S; ++s) y += __ldcg(part + ((int64_t)s * B + b) * N + col);
      y = round_bf16(y);
      if (HAS_RES) y = round_bf16(load_act(res + b * N + col) + y);
      out[b * N + col] = __float2bfloat16(y);
      if (SUMS) {
        c.tmp[b * n + i] = y * y;
        sc[b * N + col] = __float2bfloat16(y * __bfloat162float(nw[col]));
      }
    }
    if (SUMS) {
      c.sync();
      c.row_sums(c.tmp, n, ss, n0 / BLOCK_N);
    }
  }
};

}  // namespace mk

#include "megakernel_attention.cuh"
