// Attention op bodies of the CUDA backend (see megakernel_ops.cuh): a partial over one key range
// of one row's G query heads of a kv head (its tensor-core key loop in
// megakernel_attention_mma.cuh; the combine of partials in megakernel_combine.cuh). Partials
// are fp32 acc [P, G, D] and (max, sum) [P, G, 2] as compiler/attention_ops.py lays them out.
#pragma once
#include "megakernel_ctx.cuh"
#include "megakernel_attention_mma.cuh"
#include "megakernel_combine.cuh"

#ifndef MK_ATTN_RUNS
#define MK_ATTN_RUNS 1   // runs of keys a warp has in flight in lane_keys (from L2)
#endif

namespace mk {

// Keys [lo, min(lo + span, len)) of row `row`, split between the warps, whose (max, sum, acc)
// are merged in a fixed order; lane l holds dims [l * DL, (l + 1) * DL) (those below D) of each
// head's acc. Probabilities are rounded to bf16 before they weight the values, as the Triton
// body's dot takes them. Keys of a warp, two forms (LANES): each warp every NCW-th key, a key's
// scores reduced across the warp (``warp_keys``); or a key a lane (LPK lanes a key for D > 32),
// each warp a run of 32 / LPK keys at a time, one reduction a run (``lane_keys``).
// KV_RING (with LANES): the producer copies the whole cache blocks the key range meets, K and V
// a page each, into the ring ahead of the task (they depend on nothing of this step but the key
// at the row's position, which the consumers read from L2 after the wait instead). KV_L2
// (without KV_RING): the producer asks for the same blocks in L2 ahead of the task instead,
// taking no page.
template <int B, int HQ, int HKV, int S, int D, int G, int BS, bool DIRECT, bool FUSED,
          bool LANES = false, bool KV_RING = false, bool KV_L2 = false>
struct AttnPartial {
  static_assert(!KV_RING || LANES, "keys through the ring: a key a lane only");
  static constexpr int DL = (D + 31) / 32;
  static constexpr int LPK = D > 32 ? D / 32 : 1;     // lanes a key (lane_keys)
  static constexpr int DPL = D / LPK;                 // dims a lane scores (lane_keys)
  static constexpr int64_t V_SHIFT = (int64_t)B * HKV * S * D;   // K plane -> V plane
  static_assert(DL <= 8, "head dims of at most 256");
  static constexpr bool MMA_KEYS = MK_ATTN_MMA && KV_RING && D % 16 == 0 && G <= 16;
  static_assert(!LANES || (D % LPK == 0 && DPL % 8 == 0), "lane_keys: 16-byte groups a lane");
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
  __device__ static const bf16* key_row(const bf16* cache, const int* bt, int row, int s,
                                        int layer, int kv_head) {
    return cache + cache_slot<B, HKV, S, D, BS>(bt, row, min(s, S - 1), layer, 0, kv_head);
  }
  // ring pages of keys [lo, lo + span): K and V of each cache block met
  __device__ static int ring_pages(int lo, int span) {
    return KV_RING ? 2 * ((lo + span - 1) / BS - lo / BS + 1) : 0;
  }
  template <class P>
  __device__ static void pages(P& p, const bf16*, const bf16* cache, const int64_t*,
                               const int* bt, float*, float*, bf16*, int row, int kv_head, int,
                               int lo, int span, int layer, int*, int, int, int, int, float) {
    if (!KV_RING && !KV_L2) return;
    if (KV_L2) p.hold_prefetch();
    for (int blk = lo / BS; blk <= (lo + span - 1) / BS; ++blk) {
      const bf16* k = cache + cache_slot<B, HKV, S, D, BS>(bt, row, blk * BS, layer, 0, kv_head);
      if (KV_RING) {
        p.page(k, BS * D * 2);
        p.page(k + V_SHIFT, BS * D * 2);
      } else {
        p.prefetch_l2(k, BS * D * 2);
        p.prefetch_l2(k + V_SHIFT, BS * D * 2);
      }
    }
  }
  // The task's ring pages, streamed: each warp waits for a page before it reads it (`see`) and
  // gives pages back in order once it has read all of them (`give`, also those it skips: each
  // page's release needs every warp, after the page has landed); page k of the task is the
  // ring's page k - gone of this warp.
  struct Pages {
    int seen = 0, gone = 0;
  };
  template <class C>
  __device__ static void see(C& c, Pages& pg, int upto) {
    for (; pg.seen < upto; ++pg.seen)
      mbar_wait(c.ring.full_at(pg.seen - pg.gone), c.ring.phase_at(pg.seen - pg.gone));
  }
  template <class C>
  __device__ static void give(C& c, Pages& pg, int upto) {
    see(c, pg, upto);   // a page's release only once it has landed: never a phase early
    __syncwarp();
    for (; pg.gone < upto; ++pg.gone) {
      if (c.lane == 0) mbar_arrive(c.ring.empty_at(0));
      c.ring.advance();
    }
  }
  // the pages that hold keys [lo, s] (s clamped to the cache), K and V of each block
  __device__ static int pages_through(int lo, int s) {
    return 2 * (min(s, S - 1) / BS - lo / BS + 1);
  }
  // FUSED: after the partial slot, the unit's ticket; the piece that takes its last (`count`
  // pieces a launch) merges slots [first, first + count) into out (AttnCombine).
  template <class C>
  __device__ static void run(C& c, const bf16* q, const bf16* cache, const int64_t* positions,
                             const int* bt, float* acc_out, float* ml, bf16* out, int row,
                             int kv_head, int slot, int lo, int span, int layer, int* counters,
                             int epoch, int ticket, int first, int count, float scale) {
    const int npages = ring_pages(lo, span);
    if (c.drain) {
      Pages pg;
      give(c, pg, npages);
      return;
    }
    const int hi = min(lo + span, (int)positions[row] + 1);
    const bf16* qrow = q + (int64_t)row * HQ * D + kv_head * G * D;   // [G, D]
    if constexpr (MMA_KEYS) {
      MmaKeys<D, G, AttnPartial>::run(c, qrow, cache, bt, row, kv_head, lo, span, hi, layer, scale);
    } else {
      float acc[G][DL], m[G], l[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int d = 0; d < DL; ++d) acc[g][d] = 0.f;
      }
      if (LANES)
        lane_keys(c, qrow, cache, bt, row, kv_head, lo, span, hi, layer, scale, m, l, acc);
      else
        warp_keys(c, qrow, cache, bt, row, kv_head, lo, span, hi, layer, scale, m, l, acc);
      to_tmp(c, m, l, acc);
    }
    merge(c, acc_out, ml, out, row, kv_head, slot);
    if (FUSED && last_ticket(c, counters + ticket, count * epoch))
      AttnCombine<HQ, D, G>::run(c, acc_out, ml, out, row, kv_head, first, count);
  }

  // One online step over a run of U keys of scores sc (-inf: no key) and values v.
  template <int U>
  __device__ static void online(const float (&sc)[U][G], const float (&v)[U][DL], float (&m)[G],
                                float (&l)[G], float (&acc)[G][DL]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) m_new = fmaxf(m_new, sc[u][g]);
      const float ref = max_ref(m_new);
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

  template <class C>
  __device__ static void warp_keys(C& c, const bf16* qrow, const bf16* cache, const int* bt,
                                   int row, int kv_head, int lo, int span, int hi, int layer,
                                   float scale, float (&m)[G], float (&l)[G],
                                   float (&acc)[G][DL]) {
    constexpr int NCW = C::NT / 32;
    float qf[G][DL];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int d = 0; d < DL; ++d)
        qf[g][d] = has(c.lane, d) ? load_act(qrow + g * D + c.lane * DL + d) : 0.f;
    constexpr int U = DL >= 8 ? 4 : DL >= 2 ? 32 / DL : 16;   // keys a warp has in flight
    for (int s0 = lo + c.warp; s0 < lo + span; s0 += NCW * U) {
      float k[U][DL], v[U][DL], sc[U][G];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        // the loads do not wait for hi (the row's length, itself a load): every position below
        // S names a cache block; keys from hi on are read, then dropped
        const int s = s0 + u * NCW;
        const bf16* kp = key_row(cache, bt, row, s, layer, kv_head) + c.lane * DL;
        float kd[DL], vd[DL];
        load_dims(kp, c.lane, kd);
        load_dims(kp + V_SHIFT, c.lane, vd);
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
      online<U>(sc, v, m, l, acc);
    }
  }

  // A key a lane: lane l scores key l / LPK over dims [(l % LPK) * DPL, + DPL) with q from
  // shared memory, so that each score and exponential is computed once (not in every lane);
  // the probabilities then reach the lanes holding acc's dims by shuffles. The first run's keys
  // and values are asked for before q is staged (the barrier would otherwise wait for q's load
  // before they are issued).
  struct Run {
    uint4 k[DPL / 8];         // this lane's dims of its key
    float v[32 / LPK][DL];    // the run's values, this lane's dims
  };
  // (KV_RING: from the ring's pages, `ring` at the task's page `gone`, but the key at hi - 1,
  // the row's newest where the range holds it, from L2)
  template <class R>
  __device__ static void load_run(Run& r, const bf16* cache, const int* bt, int row, int layer,
                                  int kv_head, int lo, int base, int hi, int lane, const R& ring,
                                  int gone) {
    constexpr int KPW = 32 / LPK;
    const int s = base + lane / LPK;
    const int off = (lane % LPK) * DPL;
    if (KV_RING && s != hi - 1) {
      const uint4* kp = reinterpret_cast<const uint4*>(ring_row(ring, lo, s, 0, gone) + off);
#pragma unroll
      for (int j = 0; j < DPL / 8; ++j) r.k[j] = kp[j];
    } else {     // the block-table lookup only here: a page needs none
      const uint4* kp = reinterpret_cast<const uint4*>(
          key_row(cache, bt, row, s, layer, kv_head) + off);
#pragma unroll
      for (int j = 0; j < DPL / 8; ++j) r.k[j] = __ldcg(kp + j);
    }
#pragma unroll
    for (int j = 0; j < KPW; ++j) {
      float vd[DL];
      if (KV_RING && base + j != hi - 1) {
        const bf16* vp = ring_row(ring, lo, base + j, 1, gone) + lane * DL;
#pragma unroll
        for (int d = 0; d < DL; ++d) vd[d] = has(lane, d) ? __bfloat162float(vp[d]) : 0.f;
      } else {
        load_dims(key_row(cache, bt, row, base + j, layer, kv_head) + V_SHIFT + lane * DL, lane,
                  vd);
      }
#pragma unroll
      for (int d = 0; d < DL; ++d) r.v[j][d] = base + j < hi ? vd[d] : 0.f;
    }
  }
  // key s's K (kv 0) or V (kv 1) row in the task's ring pages (keys from lo on; the ring at the
  // task's page `gone`)
  template <class R>
  __device__ static const bf16* ring_row(const R& ring, int lo, int s, int kv, int gone) {
    const int blk = min(s, S - 1) / BS - lo / BS;
    return reinterpret_cast<const bf16*>(ring.page_at(2 * blk + kv - gone)) +
           (min(s, S - 1) % BS) * D;
  }
  // Each warp keeps NR runs of keys and values in flight (from L2: MK_ATTN_RUNS; from the ring
  // one, its pages streamed): run i's scores and online step, then run i + NR asked for into
  // its registers.
  template <class C>
  __device__ static void lane_keys(C& c, const bf16* qrow, const bf16* cache, const int* bt,
                                   int row, int kv_head, int lo, int span, int hi, int layer,
                                   float scale, float (&m)[G], float (&l)[G],
                                   float (&acc)[G][DL]) {
    constexpr int NCW = C::NT / 32, KPW = 32 / LPK, NR = KV_RING ? 1 : MK_ATTN_RUNS;
    constexpr int STEP = NCW * KPW;                   // keys from one of a warp's runs to the next
    float* qs = c.tmp + NCW * G * (2 + D);            // [G, D] after the merge's scratch
    const int first = lo + c.warp * KPW, end = lo + span;
    Pages pg;
    Run r[NR];
#pragma unroll
    for (int j = 0; j < NR; ++j)
      if (first + j * STEP < end)
        fetch_run(c, pg, r[j], cache, bt, row, layer, kv_head, lo, first + j * STEP, hi, end);
    for (int i = c.t; i < G * D; i += C::NT) qs[i] = load_act(qrow + i);
    c.sync();
    for (int base = first; base < end; base += NR * STEP) {
#pragma unroll
      for (int j = 0; j < NR; ++j) {
        const int b = base + j * STEP;
        if (b >= end) break;
        run_keys(r[j], qs, b, hi, c.lane, scale, m, l, acc);
        if (b + NR * STEP < end)
          fetch_run(c, pg, r[j], cache, bt, row, layer, kv_head, lo, b + NR * STEP, hi, end);
      }
    }
    if (KV_RING) give(c, pg, ring_pages(lo, span));
  }
  // load_run of keys [base, base + KPW); KV_RING: their pages waited for first, and those
  // before the block of this warp's next run given back after.
  template <class C>
  __device__ static void fetch_run(C& c, Pages& pg, Run& r, const bf16* cache, const int* bt,
                                   int row, int layer, int kv_head, int lo, int base, int hi,
                                   int end) {
    constexpr int KPW = 32 / LPK, STEP = C::NT / 32 * KPW;
    if (KV_RING) see(c, pg, pages_through(lo, min(base + KPW, end) - 1));
    load_run(r, cache, bt, row, layer, kv_head, lo, base, hi, c.lane, c.ring, pg.gone);
    if (KV_RING && base + STEP < end) give(c, pg, pages_through(lo, base + STEP) - 2);
  }
  // One run's scores (q from shared memory) and online step; keys from `base`, LPK lanes a key.
  __device__ static void run_keys(const Run& r, const float* qs, int base, int hi, int lane,
                                  float scale, float (&m)[G], float (&l)[G],
                                  float (&acc)[G][DL]) {
    constexpr int KPW = 32 / LPK;
    const int part = lane % LPK, s = base + lane / LPK;
    float sc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float dot = 0.f;
#pragma unroll
      for (int j = 0; j < DPL / 8; ++j) {
        const __nv_bfloat162* kb = reinterpret_cast<const __nv_bfloat162*>(&r.k[j]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 kf = __bfloat1622float2(kb[e]);
          const float* qg = qs + g * D + part * DPL + 8 * j + 2 * e;
          dot = fmaf(qg[0], kf.x, fmaf(qg[1], kf.y, dot));
        }
      }
#pragma unroll
      for (int off = 1; off < LPK; off <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      sc[g] = s < hi ? dot * scale : -INFINITY;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mx = sc[g];
#pragma unroll
      for (int off = LPK; off < 32; off <<= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[g], mx);
      const float ref = max_ref(m_new);
      const float alpha = __expf(m[g] - ref);
      const float p = __expf(sc[g] - ref);
      const float psum = warp_sum(part == 0 ? p : 0.f);
      const float pr = round_bf16(p);
#pragma unroll
      for (int d = 0; d < DL; ++d) acc[g][d] *= alpha;
#pragma unroll
      for (int j = 0; j < KPW; ++j) {
        const float pj = __shfl_sync(0xffffffffu, pr, j * LPK);
#pragma unroll
        for (int d = 0; d < DL; ++d) acc[g][d] = fmaf(pj, r.v[j][d], acc[g][d]);
      }
      l[g] = l[g] * alpha + psum;
      m[g] = m_new;
    }
  }

  // A warp's (max, sum, acc) into tmp: [NCW][G] max, [NCW][G] sum, [NCW][G][D] acc.
  template <class C>
  __device__ static void to_tmp(C& c, const float (&m)[G], const float (&l)[G],
                                const float (&acc)[G][DL]) {
    constexpr int NCW = C::NT / 32;
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
  }
  // The warps' (max, sum, acc) in tmp merged in a fixed order: the normalised output (DIRECT)
  // or the partial slot.
  template <class C>
  __device__ static void merge(C& c, float* acc_out, float* ml, bf16* out, int row, int kv_head,
                               int slot) {
    constexpr int NCW = C::NT / 32;
    const float* tm = c.tmp;
    const float* tl = tm + NCW * G;
    const float* ta = tl + NCW * G;
    c.sync();
    for (int idx = c.t; idx < G * D; idx += C::NT) {
      const int g = idx / D, d = idx % D;
      float mx = -INFINITY;
      for (int w = 0; w < NCW; ++w) mx = fmaxf(mx, tm[w * G + g]);
      const float ref = max_ref(mx);
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

}  // namespace mk
