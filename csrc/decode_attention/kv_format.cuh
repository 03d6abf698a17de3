// The two cache formats as traits (Kv = KvBf16 or KvFp8): a page's bulk copy
// into a ring slot, the lane fragments of q, K and V that attend_pages (see
// online_softmax.cuh for their register roles) takes, the MMA type, and the
// bank swizzle of the merge buffers.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/numerics.h"
#include "decode_attention/params.h"
#include "ptx/bulk_copy.cuh"
#include "ptx/convert.cuh"
#include "ptx/memory.cuh"
#include "ptx/mma.cuh"

namespace flint::detail {

// The lane fragments of head_dim D (online_softmax.cuh's register roles): q
// words (D / 8: bf16 pairs of a lane's D / 4 dims), K or V words of a page
// (D / 4: two token rows, or the O^T operand), O^T floats (D / 4), and D / 16
// dim steps (the MMA k-steps of S^T and the m-tiles of O^T). The formats'
// smem layouts below are those of D = 128.
template <int D>
struct HeadFragments {
  static constexpr int kHeadDim = D;
  static constexpr int kQWords = D / 8, kKvWords = D / 4, kOFloats = D / 4, kDimSteps = D / 16;
};

// V rows outside [start_tok, seq_len) are zeroed, so stale or NaN cache
// contents never reach P V (a zero P alone would not cancel a NaN). rows[r]:
// the W words a lane holds of token 2t + (r & 1) + 8(r >> 1).
template <int W>
__device__ __forceinline__ void mask_v_rows(uint32_t (&rows)[4][W], int page, int start_tok,
                                            int seq_len, int t) {
  const int first = page * kPageTokens;
  if (first < start_tok || first + kPageTokens > seq_len) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int pos = first + 2 * t + (r & 1) + 8 * (r >> 1);
      const bool attended = pos >= start_tok && pos < seq_len;
#pragma unroll
      for (int j = 0; j < W; ++j) rows[r][j] = attended ? rows[r][j] : 0u;
    }
  }
}

// The token rows [lo, hi) of page `page` that the span [start_tok, seq_len)
// attends: all 16 but at a window's first page and a request's last one. A
// bf16 page's copy brings only these; the other rows of its slot keep whatever
// they held (K's logits there are masked, V's rows zeroed: mask_v_rows).
struct PageRows {
  int lo, hi;
};
__device__ __forceinline__ PageRows attended_rows(int page, int start_tok, int seq_len) {
  const int first = page * kPageTokens;
  return {max(start_tok - first, 0), min(seq_len - first, kPageTokens)};
}

// The L2 policy of a stream's k-th page copy, in a ring of `stages` slots. The
// copies that refill a slot (k >= stages - 1) are the tail of a long stream,
// read once a call: evict-first, so they do not push out the tables, partials
// and code that the merges after the stream need. The leading copies, all a
// short stream has, keep L2's own policy (evict-first there made short
// window streams slower: docs/design.md).
__device__ __forceinline__ uint64_t page_l2_policy(int k, int stages) {
  return k >= stages - 1 ? ptx::l2_evict_first_policy() : ptx::l2_evict_unchanged_policy();
}

// ---- bf16 cache: pages of 16 rows x 512 bytes ----------------------------------
//
// q / K dims of q[4i + j]: 32i + 8t + 2j (16 contiguous bytes per i).
// V: chunk_dim(g, h) = 64h + 8g (h = 0), 64h + 8(g ^ 4) (h = 1).
//
// Ring rows are 512 bytes apart, so every row starts at bank 0 and 16-byte
// column c of any row lies in bank group c % 8. Read in fragment order, a
// quarter-warp (the 8 lanes of one g pair) would take K as two rows x the same
// four columns (2-way conflict) and V as four rows x the same two columns
// (4-way). So the lanes of odd g read each pair of K column blocks in the other
// order, the lanes t >= 2 read their two V chunks in the other order, and V's
// second chunk is dims 64 + 8(g ^ 4): K is conflict-free, V 2-way, and a select
// per word puts each fragment back.
struct KvBf16 : HeadFragments<kHeadDim> {
  static constexpr KvDtype kDtype = KvDtype::kBf16;
  static constexpr int kElemBytes = 2;
  // Pages per online-softmax step of the balanced kernel's stream
  // (page_ring.cuh): a bf16 warp waits for HBM, not for its own work.
  static constexpr int kStepPages = 1;
  static constexpr int kRowBytes = kRowElems * kElemBytes;
  static constexpr int kPageBytes = kPageTokens * kRowBytes;
  static_assert(kPageBytes == 8192 && kHeadDim == 128, "16 tokens x [K | V] of 128 bf16");
  static constexpr int kSlotAlign = 16;  // bulk copies

  __device__ __forceinline__ static void prefetch_map(const KvTensorMap* /*map*/) {}
  // The bytes copy_rows brings.
  __device__ __forceinline__ static uint32_t copy_bytes(PageRows r) {
    return (r.hi - r.lo) * kRowBytes;
  }
  // A page's rows r into its ring slot, each at its place: one bulk copy of
  // them as they lie in the cache (rows are 512 contiguous bytes), its L2
  // lines under `policy` (page_l2_policy).
  __device__ __forceinline__ static void copy_rows(void* dst, const uint8_t* page,
                                                   const KvTensorMap* /*map*/, int /*head*/,
                                                   int /*block*/, PageRows r, ptx::Mbarrier& bar,
                                                   uint64_t policy) {
    ptx::bulk_copy_g2s(static_cast<uint8_t*>(dst) + r.lo * kRowBytes, page + r.lo * kRowBytes,
                       copy_bytes(r), bar, policy);
  }

  __device__ __forceinline__ static int chunk_dim(int g, int h) {
    return 64 * h + 8 * (h == 1 ? g ^ 4 : g);
  }
  __device__ __forceinline__ static int o_tile_dim(int j, int g) {
    return chunk_dim(g, j / 4) + 2 * (j % 4);
  }
  // Column swizzle of the merge buffers (store_partial): XOR of dim d of head h.
  __device__ __forceinline__ static int buf_swizzle(int h, int /*d*/) { return h & 6; }

  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    ptx::mma_m16n8k16_bf16_f32(d, a, b0, b1);
  }
  __device__ __forceinline__ static uint32_t pack_p(float lo, float hi) {
    return ptx::pack_bf16x2(lo, hi);
  }

  // v[8r + 4h + j]: pair of token 2t + (r & 1) + 8(r >> 1) (r < 4) at dims
  // chunk_dim(g, h) + 2j, +1 (h < 2, j < 4). m-tile j's rows g, g + 8 are the
  // two halves of word j % 4 of chunk j / 4; prmt pairs tokens (2t, 2t+1) and
  // (2t+8, 2t+9) per dim.
  __device__ __forceinline__ static void v_operand(const uint32_t (&v)[kKvWords], int j,
                                                   uint32_t (&a)[4]) {
    const int hh = j / 4, wi = j % 4;
    const uint32_t va = v[4 * hh + wi], vb = v[4 * (2 + hh) + wi];
    const uint32_t vc = v[4 * (4 + hh) + wi], vd = v[4 * (6 + hh) + wi];
    a[0] = ptx::prmt(va, vb, 0x5410u);
    a[1] = ptx::prmt(va, vb, 0x7632u);
    a[2] = ptx::prmt(vc, vd, 0x5410u);
    a[3] = ptx::prmt(vc, vd, 0x7632u);
  }

  // Lane (g, t)'s q words of column g (`q_row`), as they are in memory:
  // dims 32i + 8t .. + 7 at w[4i .. 4i + 3].
  __device__ __forceinline__ static void load_q_words(const uint16_t* q_row, int t,
                                                      uint32_t (&w)[kQWords]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t x[4];
      ptx::ld_global_u32x4(q_row + 32 * i + 8 * t, x);
#pragma unroll
      for (int j = 0; j < 4; ++j) w[4 * i + j] = x[j];
    }
  }
  // q as it is; the logits need no rescaling (exponent 0).
  __device__ __forceinline__ static int prepare_q(const uint32_t (&w)[kQWords],
                                                  uint32_t (&q)[kQWords]) {
#pragma unroll
    for (int k = 0; k < kQWords; ++k) q[k] = w[k];
    return 0;
  }

  __device__ __forceinline__ static void load_page(uint32_t slot, int page, int start_tok,
                                                   int seq_len, int g, int t,
                                                   uint32_t (&k)[kKvWords], uint32_t (&v)[kKvWords]) {
    const bool k_swap = g & 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t row = slot + (g + 8 * r) * kRowBytes + 16 * t;
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        uint32_t a[4], b[4];  // column blocks 2m, 2m + 1 (swapped for odd g)
        ptx::ld_shared_u32x4(row + 128 * m + (k_swap ? 64 : 0), a);
        ptx::ld_shared_u32x4(row + 128 * m + (k_swap ? 0 : 64), b);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          k[16 * r + 8 * m + j] = k_swap ? b[j] : a[j];
          k[16 * r + 8 * m + 4 + j] = k_swap ? a[j] : b[j];
        }
      }
    }
    const bool v_swap = t >> 1;
    const uint32_t v_row0 = slot + kHeadDim * 2 + 2 * t * kRowBytes;
    const uint32_t chunk0 = chunk_dim(g, 0) * 2, chunk1 = chunk_dim(g, 1) * 2;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint32_t row = v_row0 + ((r & 1) + 8 * (r >> 1)) * kRowBytes;
      uint32_t a[4], b[4];  // chunks h = 0, 1 (swapped for t >= 2)
      ptx::ld_shared_u32x4(row + (v_swap ? chunk1 : chunk0), a);
      ptx::ld_shared_u32x4(row + (v_swap ? chunk0 : chunk1), b);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[8 * r + j] = v_swap ? b[j] : a[j];
        v[8 * r + 4 + j] = v_swap ? a[j] : b[j];
      }
    }
    mask_v_rows(reinterpret_cast<uint32_t(&)[4][8]>(v), page, start_tok, seq_len, t);
  }
};

// ---- fp8 (e4m3) cache: pages of 16 rows x 256 bytes ----------------------------
//
// The MMAs run on fp16: K and V are converted exactly (every e4m3 value is an
// fp16 value, one cvt per pair), P is rounded to fp16 (not bf16) for P V, and
// q to fp16 after scaling the tile's 8 query rows by 2^-e, the power of two
// that brings their largest |q| under 2^15 (e = 0 unless some |q| >= 2^15), so
// the logits come out 2^-e too small and 2^e multiplies the softmax scale.
// k_scale also goes into the softmax scale, v_scale into the normalization.
//
// q / K dims of q[w]: 32t + 2w, +1 (each lane's 32 dims contiguous: 32 bytes
// of a K row). V: chunk_dim(g, h) = 16g + 8h (16 contiguous bytes of a V row).
//
// A ring slot holds a page as two boxes of the cache's tensor map
// (DecodeParams::kv_map), K then V, each 16 token rows x 128 bytes with
// 128-byte swizzle: 16-byte chunk c of row T lies at chunk c ^ (T % 8) (slots
// are 1024-byte aligned, the swizzle's period). Unswizzled, rows of the same
// chunk share banks: a quarter-warp (g, g + 1 x four t) would read K's rows
// g, g + 1 at the same chunks (2-way) and V's chunk g of four rows (4-way).
// Swizzled, K's chunks 2t ^ g, (2t + 1) ^ g and V's g ^ (2t + (r & 1)) are
// eight distinct chunks per quarter-warp: every read is conflict-free.
struct KvFp8 : HeadFragments<kHeadDim> {
  static constexpr KvDtype kDtype = KvDtype::kFp8E4m3;
  static constexpr int kElemBytes = 1;
  // Two: an fp8 warp's own work is most of its time, and two pages share one
  // max / rescale round and overlap their chains of loads, conversions and MMAs.
  static constexpr int kStepPages = 2;
  static constexpr int kRowBytes = kRowElems * kElemBytes;
  static constexpr int kPageBytes = kPageTokens * kRowBytes;
  static_assert(kPageBytes == 4096 && kHeadDim == 128, "16 tokens x [K | V] of 128 e4m3");
  static constexpr int kBoxBytes = kPageTokens * kHeadDim;  // a page's K (or V) box
  static constexpr int kSlotAlign = 1024;                   // the 128-byte swizzle's period

  // At a kernel's start (the map is a kernel parameter, not written by a
  // predecessor): the first page's copy does not wait for the descriptor.
  __device__ __forceinline__ static void prefetch_map(const KvTensorMap* map) {
    ptx::prefetch_tensormap(map);
  }
  // Whole pages, whatever rows are attended: copying only the attended 8-row
  // halves (a second map of 8-row boxes) made the fp8 rows slower, not
  // faster (docs/design.md).
  __device__ __forceinline__ static uint32_t copy_bytes(PageRows /*r*/) { return kPageBytes; }
  // A page into a ring slot: its K box (c0 = 0) and V box (c0 = 128) of the
  // tensor map, at kv head `head` of block `block`.
  __device__ __forceinline__ static void copy_rows(void* dst, const uint8_t* /*page*/,
                                                   const KvTensorMap* map, int head, int block,
                                                   PageRows /*r*/, ptx::Mbarrier& bar,
                                                   uint64_t policy) {
    const uint32_t d = ptx::smem_addr(dst), b = ptx::smem_addr(&bar);
    ptx::tensor_copy_4d_g2s(d, map, 0, 0, head, block, b, policy);
    ptx::tensor_copy_4d_g2s(d + kBoxBytes, map, kHeadDim, 0, head, block, b, policy);
  }
  // Where 16-byte chunk c of row `row` of a box lies (the 128-byte swizzle).
  __device__ __forceinline__ static uint32_t chunk_addr(uint32_t box, int row, int c) {
    return box + row * kHeadDim + ((c ^ (row & 7)) << 4);
  }

  __device__ __forceinline__ static int chunk_dim(int g, int h) { return 16 * g + 8 * h; }
  __device__ __forceinline__ static int o_tile_dim(int j, int g) { return 16 * g + 2 * j; }
  // Lane (g, t) stores dims 16g + 2j of heads 2t, 2t + 1: bits 1-3 of the dim
  // take g >> 1 and t & 1, so a warp's stores of one j fill all 32 banks.
  __device__ __forceinline__ static int buf_swizzle(int h, int d) {
    return (((d >> 5) & 3) << 2) | (((h >> 1) & 1) << 1);
  }

  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    ptx::mma_m16n8k16_f16_f32(d, a, b0, b1);
  }
  __device__ __forceinline__ static uint32_t pack_p(float lo, float hi) {
    return ptx::pack_f16x2(lo, hi);
  }
  // load_page builds the operand itself.
  __device__ __forceinline__ static void v_operand(const uint32_t (&v)[kKvWords], int j,
                                                   uint32_t (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = v[4 * j + i];
  }

  // Lane (g, t)'s q words of column g: dims 32t .. 32t + 31 (bf16 pairs).
  __device__ __forceinline__ static void load_q_words(const uint16_t* q_row, int t,
                                                      uint32_t (&w)[kQWords]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t x[4];
      ptx::ld_global_u32x4(q_row + 32 * t + 8 * i, x);
#pragma unroll
      for (int j = 0; j < 4; ++j) w[4 * i + j] = x[j];
    }
  }
  // Those words as fp16 x 2^-e; returns e (the same in every lane: the max
  // runs over the warp, i.e. the tile's 8 rows).
  __device__ __forceinline__ static int prepare_q(const uint32_t (&w)[kQWords],
                                                  uint32_t (&q)[kQWords]) {
    float mx = 0.f;  // fmaxf skips a NaN: it stays NaN in q
#pragma unroll
    for (int k = 0; k < kQWords; ++k)
      mx = fmaxf(mx, fmaxf(fabsf(__uint_as_float(w[k] << 16)), fabsf(__uint_as_float(w[k] & 0xffff0000u))));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
    const int e = q_exponent(mx);
    const float s = exp2i(-e);
#pragma unroll
    for (int k = 0; k < kQWords; ++k)
      q[k] = ptx::pack_f16x2(__uint_as_float(w[k] << 16) * s, __uint_as_float(w[k] & 0xffff0000u) * s);
    return e;
  }

  // Four e4m3 (dims d .. d + 3) -> fp16 pairs (d, d + 1) and (d + 2, d + 3).
  __device__ __forceinline__ static void to_f16(uint32_t x, uint32_t& lo, uint32_t& hi) {
    ptx::cvt_f16x4_e4m3x4(x, lo, hi);
  }

  __device__ __forceinline__ static void load_page(uint32_t slot, int page, int start_tok,
                                                   int seq_len, int g, int t,
                                                   uint32_t (&k)[kKvWords], uint32_t (&v)[kKvWords]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;  // token row; row % 8 == g
      uint32_t a[4], b[4];        // dims 32t .. +15 and 32t + 16 .. +31
      ptx::ld_shared_u32x4(chunk_addr(slot, row, 2 * t), a);
      ptx::ld_shared_u32x4(chunk_addr(slot, row, 2 * t + 1), b);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        to_f16(a[j], k[16 * r + 2 * j], k[16 * r + 2 * j + 1]);
        to_f16(b[j], k[16 * r + 8 + 2 * j], k[16 * r + 8 + 2 * j + 1]);
      }
    }
    // V: raw[r][w] holds dims 16g + 4w .. + 3 of token 2t + (r & 1) + 8(r >> 1).
    // Rows outside [start_tok, seq_len) are zeroed first (e4m3 0x00 is +0).
    // Then prmt pairs the bytes of tokens (2t, 2t+1) and (2t+8, 2t+9) per dim,
    // so each cvt gives an A-operand word of O^T directly: m-tile j = 2w + e
    // (dims 16g + 4w + 2e, +1) from bytes 2e, 2e + 1 of word w.
    uint32_t raw[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
      ptx::ld_shared_u32x4(chunk_addr(slot + kBoxBytes, 2 * t + (r & 1) + 8 * (r >> 1), g), raw[r]);
    mask_v_rows(raw, page, start_tok, seq_len, t);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // tokens 2t, 2t+1 (a[0..1]); 2t+8, 2t+9 (a[2..3])
        const uint32_t x = raw[2 * half][w], y = raw[2 * half + 1][w];
        const int j0 = 2 * w;  // m-tiles j0 (bytes 0, 1) and j0 + 1 (bytes 2, 3)
        to_f16(ptx::prmt(x, y, 0x5140u), v[4 * j0 + 2 * half], v[4 * j0 + 2 * half + 1]);
        to_f16(ptx::prmt(x, y, 0x7362u), v[4 * (j0 + 1) + 2 * half],
               v[4 * (j0 + 1) + 2 * half + 1]);
      }
    }
  }
};

// Lane (g, t)'s q words of column g (`q_row`; nullptr: a column past the
// rows, zeros), as they are in memory.
template <class Kv>
__device__ __forceinline__ void load_q_words_or_zeros(const uint16_t* q_row, int t,
                                                      uint32_t (&w)[Kv::kQWords]) {
#pragma unroll
  for (int k = 0; k < Kv::kQWords; ++k) w[k] = 0u;
  if (q_row != nullptr) Kv::load_q_words(q_row, t, w);
}

// Those words in the format's MMA type; returns the exponent e the logits
// come out 2^-e too small by.
template <class Kv>
__device__ __forceinline__ int load_q(const uint16_t* q_row, int t, uint32_t (&q)[Kv::kQWords]) {
  uint32_t w[Kv::kQWords];
  load_q_words_or_zeros<Kv>(q_row, t, w);
  return Kv::prepare_q(w, q);
}

// The cache at tile u's kv head (strides are in elements, as torch reports them).
template <class Kv>
__device__ __forceinline__ const uint8_t* kv_head_of(const DecodeParams& p, int u) {
  return static_cast<const uint8_t*>(p.kv_cache) +
         kv_head_of_tile(p, u) * p.kv_stride_head * Kv::kElemBytes;
}

// What multiplies a kv head's logits as the fragments compute them (softmax
// scale x log2(e), x k_scale x 2^e for an fp8 cache: KvFp8::prepare_q) and its
// normalized output (v_scale).
struct HeadScales {
  float logits_log2;
  float out;
};

// The scales of tile u's kv head before q is loaded: the logits' without
// fp8's 2^e (with_q_exponent adds it once q is in).
// NOTE: k_scale and v_scale are read after griddepcontrol.wait, as q (a
// captured graph may update them in a kernel ahead of this one), and ahead of
// q, whose fp8 conversion waits for its loads.
template <class Kv>
__device__ __forceinline__ HeadScales head_scales(const DecodeParams& p, int u) {
  if constexpr (Kv::kDtype == KvDtype::kBf16) {
    return {p.scale_log2, 1.f};
  } else {
    const int kvh = kv_head_of_tile(p, u);
    const float k_scale = p.k_scale ? ptx::ld_global_f32(p.k_scale + p.k_scale_stride * kvh) : 1.f;
    const float v_scale = p.v_scale ? ptx::ld_global_f32(p.v_scale + p.v_scale_stride * kvh) : 1.f;
    return {p.scale_log2 * k_scale, v_scale};
  }
}

template <class Kv>
__device__ __forceinline__ HeadScales with_q_exponent(HeadScales sc, int q_exp) {
  if constexpr (Kv::kDtype != KvDtype::kBf16) sc.logits_log2 *= exp2i(q_exp);
  return sc;
}

}  // namespace flint::detail
