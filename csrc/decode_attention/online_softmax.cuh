// The online softmax of one warp, a page (or two) a step, on the lane
// fragments of q, K and V that each cache format (kv_format.cuh) loads:
// S^T = K Q^T and O^T += V^T P^T on the tensor cores, the 8 query rows of a
// tile (common.cuh: a row tile of a kv head's query heads x query tokens) as
// the n = 8 dimension of mma.m16n8k16; then the warp's state as a partial in
// shared memory, or its normalized output.
//
// Lane (g = lane / 4, t = lane % 4). Both formats hand attend_page the same
// register roles, pairs of the format's MMA type (bf16, or fp16 for fp8):
//   q[w]      pair of column g, the two dims k-step w / 2 multiplies with k[16r + w]
//   k[16r+w]  pair of token g + 8r (r < 2) at the dims of q[w]
//   v         what Kv::v_operand turns into the A operand of m-tile j of
//             O^T (dims o_tile_dim(j, g), +1 as rows g, g + 8; tokens 2t,
//             2t + 1, 2t + 8, 2t + 9 as k): bf16 holds token rows (see KvBf16),
//             fp8 the operand itself, v[4j .. 4j + 3].
// Which dims those are is each format's choice (a permutation of the 128
// dims shared by q and K, another one for V and O): it is picked so that a
// quarter-warp's 16-byte shared-memory reads spread over the banks.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/kv_format.cuh"
#include "decode_attention/params.h"
#include "ptx/memory.cuh"
#include "ptx/mma.cuh"

namespace flint::detail {

// Online-softmax state of one warp for the two columns (query rows) 2t and
// 2t+1 of lane (g, t), and its share of O^T.
template <class Kv>
struct WarpState {
  float m[2];    // running max of the raw logits S (unscaled)
  float l[2];    // this lane's part of the row sums (tokens g and g+8 of each page)
  float o[Kv::kOFloats];  // O^T: o[4j + e] is column 2t + (e & 1), dim o_tile_dim(j, g) + (e >> 1)
};

// N pages of the online softmax, one max and rescale round for all of them:
// S^T = K Q^T per page, rescale, O^T += V^T P^T per page. The pages' MMA
// chains are independent, so N > 1 gives a warp whose own latency bounds it
// (fp8: conversions, MMAs and shuffles in one chain a page) work to overlap.
// `scale_log2` is the softmax scale x log2(e) (x k_scale x 2^e for an fp8
// cache); `cs` the positions each of the lane's columns attends.
template <class Kv, int N>
__device__ __forceinline__ void attend_pages(const uint32_t (&k)[N][Kv::kKvWords],
                                             const uint32_t (&v)[N][Kv::kKvWords],
                                             const uint32_t (&q)[Kv::kQWords], const int (&page)[N],
                                             const ColumnSpans& cs, float scale_log2, int g,
                                             int t, WarpState<Kv>& st) {
  // S^T[token][head]: k-step c multiplies q[2c], q[2c + 1] with k[2c], k[2c + 1]
  // (token g) and k[16 + 2c], k[16 + 2c + 1] (token g + 8). Two accumulators
  // a page break the dependency chain of its 8 MMAs.
  // s[i][0], s[i][1]: token g of page i, columns 2t, 2t+1; s[i][2], s[i][3]: token g + 8.
  float s[N][4];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float sa[4] = {0.f, 0.f, 0.f, 0.f};
    float sb[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < Kv::kDimSteps; ++c) {
      constexpr int kRow8 = Kv::kQWords;  // token g + 8's words
      const uint32_t a[4] = {k[i][2 * c], k[i][kRow8 + 2 * c], k[i][2 * c + 1],
                             k[i][kRow8 + 2 * c + 1]};
      Kv::mma(c % 2 == 0 ? sa : sb, a, q[2 * c], q[2 * c + 1]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[i][e] = sa[e] + sb[e];
    const int pos = page[i] * kPageTokens + g;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (pos < cs.lo[e] || pos >= cs.hi[e]) s[i][e] = neg_inf();
      if (pos + 8 < cs.lo[e] || pos + 8 >= cs.hi[e]) s[i][e + 2] = neg_inf();
    }
  }

  // A column may attend no token of these pages (a query token before them,
  // or before position 0), and its logits may all be -inf: softmax_shift
  // keeps the weights 0 then.
  float mx[2] = {fmaxf(s[0][0], s[0][2]), fmaxf(s[0][1], s[0][3])};
#pragma unroll
  for (int i = 1; i < N; ++i) {
    mx[0] = fmaxf(mx[0], fmaxf(s[i][0], s[i][2]));
    mx[1] = fmaxf(mx[1], fmaxf(s[i][1], s[i][3]));
  }
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    mx[0] = fmaxf(mx[0], __shfl_xor_sync(kFullMask, mx[0], off));
    mx[1] = fmaxf(mx[1], __shfl_xor_sync(kFullMask, mx[1], off));
  }
  float alpha[2], p[N][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(st.m[h], mx[h]);
    const float shift = softmax_shift(m_new * scale_log2);
    // An unchanged max keeps the old terms' weight at exactly 1 (not ex2 of
    // the fma's rounding residual).
    alpha[h] = m_new == st.m[h] ? 1.f : ptx::ex2(fmaf(st.m[h], scale_log2, -shift));
#pragma unroll
    for (int i = 0; i < N; ++i) {
      p[i][h] = ptx::ex2(fmaf(s[i][h], scale_log2, -shift));
      p[i][h + 2] = ptx::ex2(fmaf(s[i][h + 2], scale_log2, -shift));
    }
    float sum = p[0][h] + p[0][h + 2];
#pragma unroll
    for (int i = 1; i < N; ++i) sum += p[i][h] + p[i][h + 2];
    st.m[h] = m_new;
    st.l[h] = st.l[h] * alpha[h] + sum;
  }
  // Every step rescales: a vote to skip it when no max moved put a branch
  // between the softmax and the O^T MMAs, which a warp alone on its
  // scheduler pays in latency.
#pragma unroll
  for (int j = 0; j < Kv::kDimSteps; ++j) {
    st.o[4 * j] *= alpha[0];
    st.o[4 * j + 1] *= alpha[1];
    st.o[4 * j + 2] *= alpha[0];
    st.o[4 * j + 3] *= alpha[1];
  }

#pragma unroll
  for (int i = 0; i < N; ++i) {
    // P^T as the B operand: lane (g, t) needs P[tokens 2t, 2t+1 | 2t+8, 2t+9][column g],
    // held by lanes 8t + g/2 (token 2t) and 8t + g/2 + 4 (token 2t+1), in the
    // half g % 2 of their (column 2t', 2t'+1) pairs.
    const uint32_t x = Kv::pack_p(p[i][0], p[i][1]);
    const uint32_t y = Kv::pack_p(p[i][2], p[i][3]);
    const int src = 8 * t + (g >> 1);
    const uint32_t x0 = __shfl_sync(kFullMask, x, src), x1 = __shfl_sync(kFullMask, x, src + 4);
    const uint32_t y0 = __shfl_sync(kFullMask, y, src), y1 = __shfl_sync(kFullMask, y, src + 4);
    const uint32_t sel = (g & 1) ? 0x7632u : 0x5410u;
    const uint32_t b0 = ptx::prmt(x0, x1, sel), b1 = ptx::prmt(y0, y1, sel);

    // O^T[dim][head] += V^T P^T. m-tile j: rows g, g+8 are dims d0, d0+1 with
    // d0 = o_tile_dim(j, g).
#pragma unroll
    for (int j = 0; j < Kv::kDimSteps; ++j) {
      uint32_t a[4];
      Kv::v_operand(v[i], j, a);
      float(&acc)[4] = *reinterpret_cast<float(*)[4]>(&st.o[4 * j]);
      Kv::mma(acc, a, b0, b1);
    }
  }
}

// One page of it.
template <class Kv>
__device__ __forceinline__ void attend_page(const uint32_t (&k)[Kv::kKvWords],
                                            const uint32_t (&v)[Kv::kKvWords],
                                            const uint32_t (&q)[Kv::kQWords], int page,
                                            const ColumnSpans& cs, float scale_log2, int g, int t,
                                            WarpState<Kv>& st) {
  const int pages[1] = {page};
  using Page = const uint32_t(&)[1][Kv::kKvWords];
  attend_pages<Kv, 1>(reinterpret_cast<Page>(k), reinterpret_cast<Page>(v), q, pages, cs,
                      scale_log2, g, t, st);
}

// ---- a warp's state as a partial in shared memory --------------------------------

// (O, m, l) of the 8 columns of one tile, unnormalized; O as [column][dim] with
// the dims of each column permuted by the format's buf_swizzle (bank spread of
// the stores; XOR with bits 1-3 keeps float2 pairs and at most swaps the
// halves of a float4, see partial_o4).
template <class Kv>
struct WarpPartial {
  float o[kRowTile][Kv::kHeadDim];
  float m[kRowTile];  // raw-logit max
  float l[kRowTile];  // row sum, relative to m
};

template <class Kv>
__device__ __forceinline__ void store_partial(WarpPartial<Kv>& buf, const WarpState<Kv>& st, int g,
                                              int t) {
#pragma unroll
  for (int j = 0; j < Kv::kDimSteps; ++j) {
    const int d0 = Kv::o_tile_dim(j, g);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 2 * t + e;
      ptx::st_shared_f32x2(ptx::smem_addr(&buf.o[h][d0 ^ Kv::buf_swizzle(h, d0)]), st.o[4 * j + e],
                           st.o[4 * j + 2 + e]);
    }
  }
  if (g == 0) {
    buf.m[2 * t] = st.m[0];
    buf.m[2 * t + 1] = st.m[1];
    buf.l[2 * t] = st.l[0];
    buf.l[2 * t + 1] = st.l[1];
  }
}

// Dims d .. d + 3 (d % 4 == 0) of head h of a partial.
template <class Kv>
__device__ __forceinline__ float4 partial_o4(const WarpPartial<Kv>& buf, int h, int d) {
  const int x = Kv::buf_swizzle(h, d);
  const float4 v = *reinterpret_cast<const float4*>(&buf.o[h][d ^ (x & ~3)]);
  return (x & 2) ? make_float4(v.z, v.w, v.x, v.y) : v;
}

// Stores a warp's normalized O^T: lane (g, t) writes columns 2t, 2t+1 (output
// rows head0, head1; nullptr: a column without a row) at dims d0, d0 + 1 of
// m-tile j (d0 = o_tile_dim(j, g)), one bf16 pair each.
template <class Kv>
__device__ __forceinline__ void store_warp_out(uint16_t* head0, uint16_t* head1,
                                               const float (&o)[Kv::kOFloats], float inv0,
                                               float inv1, int g, int t) {
  const bool has0 = head0 != nullptr, has1 = head1 != nullptr;
#pragma unroll
  for (int j = 0; j < Kv::kDimSteps; ++j) {
    const int d0 = Kv::o_tile_dim(j, g);
    if (has0)
      *reinterpret_cast<uint32_t*>(head0 + d0) = ptx::pack_bf16x2(o[4 * j] * inv0, o[4 * j + 2] * inv0);
    if (has1)
      *reinterpret_cast<uint32_t*>(head1 + d0) =
          ptx::pack_bf16x2(o[4 * j + 1] * inv1, o[4 * j + 3] * inv1);
  }
}

}  // namespace flint::detail
