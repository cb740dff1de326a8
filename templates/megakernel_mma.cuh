// Tensor-core projections of the CUDA backend (Ctx's MMA, from 5 batch rows on): the producer's
// weight tiles by TMA and the consumers' x chunks and mma.sync products.
//
// A projection task of SEGS segments of n weight rows each (n0.. of each segment's matrix),
// over KS columns of K from k0, is walked in chunks of 64 columns (128 bytes a row). For each
// chunk the producer copies the segments' [n, 64] tiles, padded to 8 rows, end to end into a
// ring page (as many chunks a page as fit it, up to MK_CHUNKS: a narrow task's pages full too)
// with TMA tensor copies (maps over the weight arena as [rows, K], one a row length
// and box height; 128-byte swizzle: row r's 16-byte piece c at r * 128 + (c ^ r % 8) * 16, the
// page 1024-byte aligned). x's chunk [B, 64] comes into one of XS stages of B padded to 16
// rows by a tensor copy too (a map of x's row length, boxes of B rows; the stage's rows past
// B: what an earlier copy left, their products never read). The consumer warps multiply on
// their own, no barrier between them: the chunk's weight rows in 16-row tiles (mma's A; two
// of the 8-row boxes) are split between WN warp groups (a tile a warp while there are no more
// tiles than warps) and the chunks between the WK = NCW / WN warps of a group; x's rows in
// 8-row tiles are mma's B; fragments by ldmatrix, mma.sync.m16n8k16 (bf16 in, fp32
// accumulators; x as B instead of A: 24 of 32 loads and products a chunk at 17
// rows, H200 17 rows 2.220 -> 2.188 ms, 64 rows 3.673 -> 3.703). The accumulators land in acc
// [SEGS * n, WK, B] (row s * n + r of the segments, WK parts a row, summed in a fixed order by
// Ctx::result): the op bodies' epilogues read them as they read the CUDA-core projection's.
#pragma once
#include <cuda.h>
#include "megakernel_ring.cuh"

#ifndef MK_XKS
#define MK_XKS 0   // the row lengths of x's maps (tensor cores), in the kernel's Maps order
#endif

namespace mk {

constexpr int KC = 64;                         // columns a chunk: 128 bytes of a weight row
constexpr int NBOX = 5;                        // maps a row length: box heights 128 >> b

#ifndef MK_CHUNKS
#define MK_CHUNKS 4   // chunks a ring page holds at most (a power of two)
#endif

// Chunks of `tile` bytes a page of PAGE bytes takes: a power of two up to MK_CHUNKS.
template <int PAGE>
__device__ __forceinline__ int chunks_a_page(int tile) {
  int c = MK_CHUNKS;
  while (c > 1 && c * tile > PAGE) c >>= 1;
  return c;
}

// byte offset of row r's 16-byte piece c in a 128-byte-swizzled tile
__device__ __forceinline__ int swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* map, int col, int row,
                                       uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];"
      ::"r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row),
      "r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const unsigned char* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
// the same, each 8x8 matrix transposed (thread i: rows 2 (i % 4), + 1 of column i / 4)
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const unsigned char* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const unsigned char* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}

// c[16 x 8] += a[16 x 16] (row-major) @ b[16 x 8] (col-major), bf16 in, fp32 out
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Rows of a page a segment of n rows takes (whole 8-row boxes).
__device__ __forceinline__ int padded8(int n) { return (n + 7) & ~7; }

// Warp groups over a task's n-tiles (8-row boxes): two a warp at most, one 16-row tile (a power
// of two up to NCW); the NCW / groups warps of a group take every that-many-th chunk (a narrow
// task's chunks are read by several warps at once: each warp's chain of loads and products a
// chunk is long).
template <int NCW>
__host__ __device__ constexpr int n_groups(int tiles) {
  int g = 1;
  while (g < NCW && 2 * g < tiles) g <<= 1;
  return g;
}
// 16-row tiles a warp holds at most, for tasks of up to `most` n-tiles (group g's 16-row
// tiles: g, g + groups, ...)
template <int NCW>
__host__ __device__ constexpr int tiles_a_warp(int most) {
  int w = 1;
  for (int t = 1; t <= most; ++t) {
    const int g = n_groups<NCW>(t), need = ((t + 1) / 2 + g - 1) / g;
    w = need > w ? need : w;
  }
  return w;
}

// The TMA maps of the weight arena, NBOX a row length of NK row lengths, then x's (the
// activation arena read as [rows, K] in boxes of B padded to 16 rows), one a row length (the
// kernel's __grid_constant__ parameter).
template <int NK>
struct Maps {
  CUtensorMap m[NK * NBOX];
  CUtensorMap x[NK];
};

// The producer's copies of a tensor-core task: for each 64-column chunk of [k0, k0 + KS), each
// segment's rows [row_s, row_s + n) of its matrix (at src[s]) as 8-row-aligned boxes into one
// page. `map` is the row length K's first map.
template <class P, int K, int KS, int SEGS>
__device__ void tiles(P& p, const CUtensorMap* map, const bf16* base,
                      const bf16* const (&src)[SEGS], int n, int k0) {
  static_assert(KS % 8 == 0, "tensor-core projections take whole 16-byte pieces");
  constexpr int CH = (KS + KC - 1) / KC;    // columns past K: zeros (the map's end)
  int row[SEGS];
#pragma unroll
  for (int s = 0; s < SEGS; ++s) row[s] = (int)((src[s] - base) / K);
  const int rp = padded8(n), tile = SEGS * rp * 128, cpp = chunks_a_page<P::PAGE_BYTES>(tile);
  for (int ch0 = 0; ch0 < CH; ch0 += cpp) {
    const int m = min(cpp, CH - ch0);
    unsigned char* page = p.begin_page(m * tile);
    uint64_t* bar = p.ring.full + p.ring.slot;
    int at = 0;    // rows of the page filled (8-row boxes: every copy 1024-byte aligned)
    for (int ch = ch0; ch < ch0 + m; ++ch)
#pragma unroll
      for (int s = 0; s < SEGS; ++s)
        for (int r = 0, b = 0; r < rp; r += 128 >> b) {
          while ((128 >> b) > rp - r) ++b;
          tma_2d(page + at * 128, map + b, k0 + ch * KC, row[s] + r, bar);
          at += 128 >> b;
        }
    p.ring.advance();
  }
}

// x's chunks of a worker's consumers: XS stages of [B padded to 16, 64] (128-byte swizzle),
// then a full barrier a stage (its tensor copy landed), an empty one (every consumer warp done
// with it), and where the copies come from: x's maps, one a row length of MK_XKS, over the
// buffer at `base` (kept here for the one thread that copies, not in every thread's registers).
template <int B, int XS>
struct XStages {
  static constexpr int STAGE = (B + 15) / 16 * 16 * 128, BYTES = XS * (STAGE + 16) + 16;
  struct Source {
    const CUtensorMap* maps;
    const bf16* base;
  };
  static __device__ uint64_t* full(unsigned char* xs) {
    return reinterpret_cast<uint64_t*>(xs + XS * STAGE);
  }
  static __device__ Source* source(unsigned char* xs) {
    return reinterpret_cast<Source*>(full(xs) + 2 * XS);
  }
  static __device__ void init(unsigned char* xs, int ncw, const CUtensorMap* maps,
                              const bf16* base) {
    for (int s = 0; s < XS; ++s) {
      mbar_init(full(xs) + s, 1);
      mbar_init(full(xs) + XS + s, ncw);
    }
    *source(xs) = Source{maps, base};
  }
};

// x's map of row length XK among MK_XKS's
template <int XK>
__device__ __forceinline__ const CUtensorMap* xmap(const CUtensorMap* maps) {
  constexpr int KS[] = {MK_XKS};
  int i = 0;
  while (i < (int)(sizeof(KS) / sizeof(int)) - 1 && KS[i] != XK) ++i;
  return maps + i;
}

// x's stores (generic proxy, acquired or ordered by a barrier) before tensor copies read it
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// One chunk's products of a warp: its TPW 16-row weight tiles (A, rows a_row of the page's
// chunk at wt) times x's NB 8-row tiles (B, the stage's chunk at xt) into acc, k-step by
// k-step; SLICE > 0: the k-steps from column SLICE of the task's on left out (kc: the chunk's
// first column).
template <int NB, int TPW, int SLICE>
__device__ __forceinline__ void chunk_products(float (&acc)[NB][TPW][4],
                                               const unsigned char* wt,
                                               const unsigned char* xt, const int (&a_row)[TPW],
                                               int kc, int lane) {
#pragma unroll
  for (int kk = 0; kk < KC / 16; ++kk) {
    if (SLICE && kc + kk * 16 >= SLICE) break;   // the next slice's
    uint32_t xb[NB][2];   // x's 8-row tiles' B fragments, two an ldmatrix
#pragma unroll
    for (int p = 0; p < NB / 2; ++p) {
      uint32_t r[4];
      ldsm_x4(r, xt + swz(16 * p + lane / 16 * 8 + lane % 8, 2 * kk + lane / 8 % 2));
      xb[2 * p][0] = r[0], xb[2 * p][1] = r[1];
      xb[2 * p + 1][0] = r[2], xb[2 * p + 1][1] = r[3];
    }
    if (NB % 2) ldsm_x2(xb[NB - 1], xt + swz(8 * (NB - 1) + lane % 8, 2 * kk + lane / 8 % 2));
#pragma unroll
    for (int j = 0; j < TPW; ++j) {
      uint32_t a[4];   // the tile's rows a_row, k pieces 2kk + lane / 16
      ldsm_x4(a, wt + swz(a_row[j], 2 * kk + lane / 16));
#pragma unroll
      for (int m = 0; m < NB; ++m) mma16816(acc[m][j], a, xb[m]);
    }
  }
}

// A warp's products into out [SEGS * n, wk, B] (its part gk): lane (g, t) holds page rows
// tile * 16 + g (+ 8) of its tiles (group gn's: gn, gn + wn, ...) for batch rows m * 8 + 2t
// (+ 1); rows past the task's (tiles 8-row boxes of n rows a segment padded to 8) and batch
// rows past B left out.
template <int B, int NB, int TPW>
__device__ __forceinline__ void store_products(float* out, const float (&acc)[NB][TPW][4],
                                               int lane, int gn, int wn, int gk, int wk,
                                               int tiles, int n) {
  const int g = lane / 4, t2 = 2 * (lane % 4), rp = padded8(n), mtiles = (tiles + 1) / 2;
#pragma unroll
  for (int j = 0; j < TPW; ++j) {
    const int tile = gn + j * wn;
    if (tile >= mtiles) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = tile * 16 + g + (e >> 1) * 8, seg = i / rp, r = i % rp;
      if (i >= tiles * 8 || r >= n) continue;
#pragma unroll
      for (int m = 0; m < NB; ++m) {
        const int b = m * 8 + t2 + (e & 1);
        if (b < B) out[((seg * n + r) * wk + gk) * B + b] = acc[m][j][e];
      }
    }
  }
}

// This lane's row of a warp's TPW 16-row tiles' A fragments (group gn's tiles: gn, gn + wn,
// ...; a task of `tiles` 8-row boxes): past the task's last tile or the chunk's last row, the
// last again (products never stored: no predicated ldmatrix or mma, each of which would need a
// warp sync of its own and keep the loads from running ahead).
template <int TPW>
__device__ __forceinline__ void a_rows(int (&a_row)[TPW], int gn, int wn, int tiles, int lane) {
  const int mtiles = (tiles + 1) / 2;   // the chunk's 16-row weight tiles
#pragma unroll
  for (int j = 0; j < TPW; ++j)
    a_row[j] = min(min(gn + j * wn, mtiles - 1) * 16 + lane % 16, tiles * 8 - 1);
}

// A chunk's entry in a wait log (MK_CHUNK_LOG): its task, the task's chunks, the chunk, and
// the stamps at its top, after x's request, after the page's wait and after the products'
// issue, then now (after the warp's sync).
__device__ __forceinline__ void log_chunk(WaitLog& log, int task, int chunks, int ch,
                                          int64_t top, int64_t requested, int64_t paged,
                                          int64_t issued) {
  log.add(((int64_t)task << 32) | ((int64_t)chunks << 16) | ch, top, requested, paged,
          globaltimer(), issued);
}

// The consumers' side: acc [SEGS * n, WK, B] of x [B, XK] columns [k0, k0 + KS) times the
// pages' rows; returns WK. x's chunks come by tensor copies (x at row (x - base) / XK of its
// map, XStages::Source) into XStages, requested by thread 0 XS - 2 chunks ahead of the one
// read (its last reader two chunks behind), c.xn counting the chunks taken; each warp waits
// for its chunks and pages and frees them on its own. Every warp waits for and frees every
// page and x chunk (also when draining; x is then neither copied nor counted): waiting only
// for a warp's own chunks (every WK-th), with arrivals of several at once, was no faster
// (H200, llama-3.2-1b, 17 rows, four 16-row tiles a warp of a wide task: 2.172 ms against
// 2.146; two: 2.109). `pre`: the caller's own loads, run once x's first chunks are asked for
// (their latencies overlap).
template <class C, int B, int XK, int KS, int SEGS, int NMAX, int XS, class Pre>
__device__ int mma_project(C& c, const bf16* x, int k0, int n, Pre&& pre) {
  constexpr int NCW = C::NCW, CH = (KS + KC - 1) / KC, XB = XStages<B, XS>::STAGE;
  constexpr int TPW = tiles_a_warp<NCW>(SEGS * ((NMAX + 7) / 8));   // 16-row tiles a warp
  constexpr int NB = (B + 7) / 8;                                     // x's 8-row tiles
  constexpr int AHEAD = XS - 2;
  static_assert(XS >= 3, "x chunks: at least three stages");
  static_assert(KS % 16 == 0 || KS == XK, "a K slice of whole k-steps (past x's row: zeros)");
  const int rp = padded8(n), tiles = SEGS * rp / 8;
  const int cpp = chunks_a_page<C::PAGE_BYTES>(tiles * 1024);
  const int wn = n_groups<NCW>(tiles), wk = NCW / wn;
  const int gn = c.warp % wn, gk = c.warp / wn;
  uint64_t* xfull = XStages<B, XS>::full(c.xs);
  uint64_t* xempty = xfull + XS;
  const uint32_t x0 = c.xn;
  auto request = [&](int ch) {   // thread 0: x's chunk ch, once its stage is free
    const uint32_t g = x0 + ch, s = g % XS;
    const typename XStages<B, XS>::Source src = *XStages<B, XS>::source(c.xs);
    if (g >= XS) mbar_wait(xempty + s, (g / XS - 1) & 1);   // its last reader done
    mbar_expect(xfull + s, B * 128);
    tma_2d(c.xs + s * XB, xmap<XK>(src.maps), k0 + ch * KC, (int)((x - src.base) / XK),
           xfull + s);
  };
  if (!c.drain && c.t == 0) {
    fence_proxy_async();
    for (int ch = 0; ch < AHEAD && ch < CH; ++ch) request(ch);
  }
  pre();
  int a_row[TPW];
  a_rows<TPW>(a_row, gn, wn, tiles, c.lane);
  float acc[NB][TPW][4] = {};
  for (int ch = 0; ch < CH; ++ch) {
    const int64_t t0 = MK_CHUNK_LOG ? globaltimer() : 0;
    if (!c.drain && c.t == 0 && ch + AHEAD < CH) request(ch + AHEAD);
    const int64_t t1 = MK_CHUNK_LOG ? globaltimer() : 0;
    const int q = ch % cpp;    // the chunk's place in its page
    if (q == 0) mbar_wait(c.ring.full + c.ring.slot, c.ring.phase);
    const int64_t t2 = MK_CHUNK_LOG ? globaltimer() : 0;
    const uint32_t g = x0 + ch, st = g % XS;   // x's stage
    if (!c.drain) {
      mbar_wait(xfull + st, (g / XS) & 1);
      if (ch == 0) c.mark(1);   // the first page and x's first chunk landed
      const unsigned char* wt = c.ring.page() + q * tiles * 1024;
      if (MK_PROBE != 5 && (ch & (wk - 1)) == gk)   // the group's chunk (probe 5: none)
        chunk_products<NB, TPW, (KS % KC && KS < XK) ? KS : 0>(acc, wt, c.xs + st * XB, a_row,
                                                                ch * KC, c.lane);
    }
    const int64_t t3 = MK_CHUNK_LOG ? globaltimer() : 0;   // (after the products' issue)
    const bool last = q == cpp - 1 || ch == CH - 1;   // the page's last chunk
    __syncwarp();
    if (MK_CHUNK_LOG && c.lane == 0) log_chunk(c.log, c.task, CH, ch, t0, t1, t2, t3);
    if (c.lane == 0) {   // the warp done with x's chunk (none drained) and the page
      if (!c.drain) mbar_arrive(xempty + st);
      if (last) mbar_arrive(c.ring.empty + c.ring.slot);
    }
    if (last) c.ring.advance();
  }
  if (c.drain) return wk;
  c.xn = x0 + CH;
  store_products<B, NB, TPW>(c.acc, acc, c.lane, gn, wn, gk, wk, tiles, n);
  return wk;
}

// A worker's producer: the ring's copier with the weight arena's maps (NK row lengths `ks`);
// a projection's weights as whole rows (``Producer::stream``) or, MMA, as tiles.
template <int NPAGE, int PAGE, int NCW, int FLIGHT, int FLIGHT_BYTES, bool MMA, int NK>
struct WeightProducer : Producer<NPAGE, PAGE, NCW, FLIGHT, FLIGHT_BYTES> {
  const CUtensorMap* maps;   // [NK, NBOX]
  const bf16* base;          // the arena's first element (row 0 of every map)
  int ks[NK];

  __device__ const CUtensorMap* map_of(int k) const {
    int i = 0;
    while (i < NK - 1 && ks[i] != k) ++i;
    return maps + i * NBOX;
  }
  // rows [src[s], src[s] + n * K) of each segment, over the whole of K
  template <int K, int SEGS>
  __device__ void project(const bf16* const (&src)[SEGS], int n) {
    if constexpr (MMA) {
      tiles<WeightProducer, K, K, SEGS>(*this, map_of(K), base, src, n, 0);
    } else {
#pragma unroll
      for (int s = 0; s < SEGS; ++s) this->template stream<K>(src[s], n);
    }
  }
  // rows [src, src + n * K) over columns [k0, k0 + KS) (tensor-core K slices only)
  template <int K, int KS>
  __device__ void slice(const bf16* src, int n, int k0) {
    static_assert(MMA, "K slices are built for tensor-core projections only");
    const bf16* const one[1] = {src};
    tiles<WeightProducer, K, KS, 1>(*this, map_of(K), base, one, n, k0);
  }
};

}  // namespace mk
