// Tensor-core projections of the CUDA backend (Ctx's MMA, from 5 batch rows on): the producer's
// weight tiles by TMA and the consumers' x chunks and mma.sync products.
//
// A projection task of SEGS segments of n weight rows each (n0.. of each segment's matrix),
// over KS columns of K from k0, is walked in chunks of 64 columns (128 bytes a row). For each
// chunk the producer copies the segments' [n, 64] tiles, padded to 8 rows, end to end into a
// ring page (as many chunks a page as fit it, up to MK_CHUNKS: a narrow task's pages full too)
// with TMA tensor copies (maps over the weight arena as [rows, K], one a row length
// and box height; 128-byte swizzle: row r's 16-byte piece c at r * 128 + (c ^ r % 8) * 16, the
// page 1024-byte aligned). The consumers copy x's chunk [B, 64] (row stride XK) into a ring of
// XS stages of shared memory with cp.async (from L2, the same swizzle, rows past B never
// written: their products are never read), and multiply: the page's n-tiles (8 rows) are split
// between WN warp groups and each 16-wide k-step of the chunks between NCW / WN groups (fewer
// than 8 n-tiles: the k-steps split too), fragments by ldmatrix, mma.sync.m16n8k16 (bf16 in,
// fp32 accumulators). The accumulators land in acc [SEGS * n, WK, B] (row s * n + r of the
// segments, WK parts a row, summed in a fixed order by Ctx::result): the op bodies' epilogues
// read them as they read the CUDA-core projection's.
#pragma once
#include <cuda.h>
#include "megakernel_ring.cuh"

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

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const unsigned char* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
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

// Warp groups over a task's n-tiles: as many as there are tiles, up to NCW (a power of two).
template <int NCW>
__device__ __forceinline__ int n_groups(int tiles) {
  int g = NCW;
  while (g > 1 && g > tiles) g >>= 1;
  return g;
}

// The TMA maps of the weight arena, NBOX a row length of NK row lengths (the kernel's
// __grid_constant__ parameter), and the arena's first element (row coordinates).
template <int NK>
struct Maps {
  CUtensorMap m[NK * NBOX];
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

// The consumers' side: acc [SEGS * n, WK, B] of x [B, XK] columns [k0, k0 + KS) times the
// pages' rows; returns WK. Every warp waits for and frees every page (also when draining).
template <class C, int B, int XK, int KS, int SEGS, int NMAX, int XS>
__device__ int mma_project(C& c, const bf16* x, int n) {
  constexpr int NCW = C::NCW, MT = (B + 15) / 16, CH = (KS + KC - 1) / KC, XB = MT * 16 * 128;
  constexpr int TPW = (SEGS * ((NMAX + 7) / 8) + NCW - 1) / NCW > 2
                          ? (SEGS * ((NMAX + 7) / 8) + NCW - 1) / NCW : 2;   // n-tiles a warp
  static_assert(XS >= 2, "x chunks: at least two stages");
  const int rp = padded8(n), tiles = SEGS * rp / 8;
  const int cpp = chunks_a_page<C::PAGE_BYTES>(tiles * 1024);
  const int wn = n_groups<NCW>(tiles), wk = NCW / wn;
  const int gn = c.warp % wn, gk = c.warp / wn;
  unsigned char* xs = c.xs;
  auto load = [&](int ch) {      // x's chunk ch into its stage, as one cp.async group
    if (!c.drain && ch < CH)
      for (int i = c.t; i < B * 8; i += C::NT) {
        unsigned char* dst = xs + (ch % XS) * XB + swz(i / 8, i % 8);
        const int col = ch * KC + (i % 8) * 8;
        if (KS % KC == 0 || col < KS)
          cp_async16(dst, x + (int64_t)(i / 8) * XK + col);
        else   // past the slice: zeros, whatever the weights' columns there hold
          *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    cp_async_commit();
  };
  float acc[MT][TPW][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < TPW; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
  for (int ch = 0; ch < XS - 1; ++ch) load(ch);
  for (int ch = 0; ch < CH; ++ch) {
    cp_async_wait<XS - 2>();
    c.sync();                    // chunk ch landed for all; every warp done with chunk ch - 1
    load(ch + XS - 1);
    const int q = ch % cpp;    // the chunk's place in its page
    if (q == 0) mbar_wait(c.ring.full + c.ring.slot, c.ring.phase);
    if (!c.drain) {
      const unsigned char* wt = c.ring.page() + q * tiles * 1024;
      const unsigned char* xt = xs + (ch % XS) * XB;
#pragma unroll
      for (int kk = 0; kk < KC / 16; ++kk) {
        if ((ch * (KC / 16) + kk) % wk != gk) continue;
        uint32_t b[TPW][2];   // the warp's tiles' fragments, then x's an m-tile at a time
#pragma unroll
        for (int j = 0; j < TPW; ++j)
          if (gn + j * wn < tiles)
            ldsm_x2(b[j], wt + swz((gn + j * wn) * 8 + c.lane % 8, 2 * kk + (c.lane / 8) % 2));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          uint32_t a[4];   // rows m * 16 + lane % 16, k pieces 2kk + lane / 16
          ldsm_x4(a, xt + swz(m * 16 + c.lane % 16, 2 * kk + c.lane / 16));
#pragma unroll
          for (int j = 0; j < TPW; ++j)
            if (gn + j * wn < tiles) mma16816(acc[m][j], a, b[j]);
        }
      }
    }
    if (q == cpp - 1 || ch == CH - 1) {
      __syncwarp();
      if (c.lane == 0) mbar_arrive(c.ring.empty + c.ring.slot);
      c.ring.advance();
    }
  }
  cp_async_wait<0>();
  if (c.drain) return wk;
  const int g = c.lane / 4, t2 = 2 * (c.lane % 4);
#pragma unroll
  for (int j = 0; j < TPW; ++j) {   // (batch m*16 + g [+ 8], page rows tile*8 + t2 [+ 1])
    const int tile = gn + j * wn;
    if (tile >= tiles) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = tile * 8 + t2 + (e & 1), seg = i / rp, r = i % rp;
      if (r >= n) continue;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int b = m * 16 + g + (e >> 1) * 8;
        if (b < B) c.acc[((seg * n + r) * wk + gk) * B + b] = acc[m][j][e];
      }
    }
  }
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
