// Small device helpers shared by the decode kernel and its merges.
#pragma once

#include <cstdint>

#include "decode_attention/division.h"
#include "decode_attention/params.h"
#include "ptx/memory.cuh"

namespace flint::detail {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Inclusive prefix sum of x over the lanes of the warp.
template <class T>
__device__ __forceinline__ T warp_inclusive_sum(T x, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const T y = __shfl_up_sync(kFullMask, x, off);
    if (lane >= off) x += y;
  }
  return x;
}

// What the weights' exponents subtract for a running max m (m_scaled = m c):
// m c, or 0 where m c is -inf (every logit so far -inf, or m c below
// -FLT_MAX). The weights are then 0, not 2^(-inf - -inf) = NaN; the sink term
// keeps m c (the CPU path's `shift`, README "Non-finite values").
__device__ __forceinline__ float softmax_shift(float m_scaled) {
  return m_scaled == neg_inf() ? 0.f : m_scaled;
}

// Weight of a partial with max m against the merged max's shift
// (softmax_shift): 0 for a partial that saw no token (m = -inf).
__device__ __forceinline__ float rescale(float m, float scale_log2, float shift) {
  return m == neg_inf() ? 0.f : ptx::ex2(fmaf(m, scale_log2, -shift));
}

// The softmax finished with the sink term, what multiplies a row's summed
// V P: v / (l + 2^(sink log2(e) - m c)), with v = v_scale (1 for bf16), l the
// row sum relative to the max m, m_scaled = m c (c: the logits' scale x
// log2(e)) and sink_log2 = sink x log2(e). The sink weighs against the same
// max as the tokens, so it needs no rescaling of its own. A row that attends
// nothing (a query token before position 0) outputs 0: without a sink its
// l + 2^(sink - m c) would be 0 / 0.
__device__ __forceinline__ float normalize_with_sink(float v, float l, float sink_log2,
                                                     float m_scaled, bool attends) {
  return attends ? v / (l + ptx::ex2(sink_log2 - m_scaled)) : 0.f;
}

// n / d for 0 <= n < 2^31, f = fast_div_of(d) (params.h): n + the high word of
// n x mul fits 32 bits.
__device__ __forceinline__ int divide(int n, FastDiv f) {
  return int((__umulhi(unsigned(n), f.mul) + unsigned(n)) >> f.shift);
}

// ---- row tiles and their columns ----------------------------------------------
// The kernels divide tiles (DecodeParams::tiles): tile u is row tile u %
// row_tiles of kv head u / row_tiles. Its column j (< 8) is the kv head's
// query row r = 8 (u % row_tiles) + j: query token r / G, query head r % G of
// the group (G = p.group). A column past the Q x G rows holds a zero query;
// nothing of it is stored, and its q row and sink are never read (they do not
// exist). The quotients are FastDiv's: a column costs a few instructions at
// every site that asks, one token or many.
__device__ __forceinline__ int kv_head_of_tile(const DecodeParams& p, int u) {
  return divide(u, p.by_row_tiles);
}

// Column j of tile u as a query row: its token and its query head (an index
// into the call's heads); token < 0 past the rows.
struct Column {
  int token, head;
};
__device__ __forceinline__ Column column_of(const DecodeParams& p, int u, int j) {
  const int g = p.group;
  const int kvh = divide(u, p.by_row_tiles);
  const int r = (u - kvh * p.row_tiles) * kRowTile + j;
  if (r >= g * p.q_tokens) return {-1, 0};
  const int i = divide(r, p.by_group);
  return {i, kvh * g + r - i * g};
}

// Where request b's row of column c lies in a [batch, q_tokens, heads, ...]
// tensor of these strides (only where c.token >= 0).
__device__ __forceinline__ int64_t row_offset(int b, Column c, int64_t stride_b, int64_t stride_t,
                                              int64_t stride_h) {
  return b * stride_b + c.token * stride_t + c.head * stride_h;
}

__device__ __forceinline__ const uint16_t* q_row_of(const DecodeParams& p, int b, Column c) {
  return c.token >= 0 ? p.q + row_offset(b, c, p.q_stride_b, p.q_stride_t, p.q_stride_h)
                      : nullptr;
}

// The column's output row; nullptr past the rows.
__device__ __forceinline__ uint16_t* out_row_of(const DecodeParams& p, int b, Column c) {
  return c.token >= 0 ? p.out + row_offset(b, c, p.out_stride_b, p.out_stride_t, p.out_stride_h)
                      : nullptr;
}

// The column's sink x log2(e): -inf (no sink) without sinks and past the rows.
__device__ __forceinline__ float sink_log2_of(const DecodeParams& p, Column c) {
  return p.sinks != nullptr && c.token >= 0 ? p.sinks[c.head] * kLog2eF : neg_inf();
}

// The end (exclusive) of the positions the column attends, for a request of
// seq_len tokens (clamped: seq_extent): its query token i sits at position
// seq_len - Q + i. <= 0 where it attends nothing (a token before position 0,
// or no row).
__device__ __forceinline__ int column_end(const DecodeParams& p, int seq_len, Column c) {
  return c.token >= 0 ? seq_len - p.q_tokens + 1 + c.token : 0;
}

// The positions [lo[e], hi[e]) that lane (g, t)'s columns 2t + e of tile u
// attend: the window (if any) before each query token's own position.
struct ColumnSpans {
  int lo[2], hi[2];
};
__device__ __forceinline__ ColumnSpans column_spans(const DecodeParams& p, int seq_len, int u,
                                                    int t) {
  ColumnSpans cs;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    cs.hi[e] = column_end(p, seq_len, column_of(p, u, 2 * t + e));
    cs.lo[e] = p.window > 0 ? cs.hi[e] - p.window : 0;
  }
  return cs;
}

// The column's log-sum-exp, when the call asks for it: ln 2 x (m c + log2(l +
// 2^(sink log2(e) - m c))), the natural log of the denominator that
// normalize_with_sink divides by; where m c is -inf (no position, or every
// logit -inf) only the sink is left (-inf without one).
__device__ __forceinline__ void store_lse(const DecodeParams& p, int b, Column c, float l,
                                          float sink_log2, float m_scaled) {
  if (p.lse == nullptr || c.token < 0) return;
  const float lse2 =
      m_scaled == neg_inf() ? sink_log2 : m_scaled + ptx::lg2(l + ptx::ex2(sink_log2 - m_scaled));
  p.lse[row_offset(b, c, p.lse_stride_b, p.lse_stride_t, p.lse_stride_h)] = lse2 * kLn2F;
}

// One chunk of partials into the running sums of one head's dims: o += w_c O_c,
// l += w_c l_c, with w_c = weight_of(c) (the caller's rescaling rule).
template <int E, int kChunk, class WeightOf>
__device__ __forceinline__ void add_weighted(float (&o)[E], float& l, const float (&lv)[kChunk],
                                             const float4 (&v)[kChunk][E / 4],
                                             WeightOf weight_of) {
#pragma unroll
  for (int c = 0; c < kChunk; ++c) {
    const float w = weight_of(c);
    l += w * lv[c];
#pragma unroll
    for (int i = 0; i < E / 4; ++i) {
      o[4 * i] += w * v[c][i].x;
      o[4 * i + 1] += w * v[c][i].y;
      o[4 * i + 2] += w * v[c][i].z;
      o[4 * i + 3] += w * v[c][i].w;
    }
  }
}

// Writes (o, m, l) of head eh, dims [ed, ed + E) as workspace partial `row`.
template <int E>
__device__ __forceinline__ void store_global_partial(const DecodeParams& p, int64_t row,
                                                     const float (&o)[E], float m, float l, int eh,
                                                     int ed) {
  float* po = p.part_o + row * (kRowTile * kHeadDim) + eh * kHeadDim + ed;
#pragma unroll
  for (int e = 0; e < E; e += 4)
    ptx::st_global_u32x4(po + e, __float_as_uint(o[e]), __float_as_uint(o[e + 1]),
                         __float_as_uint(o[e + 2]), __float_as_uint(o[e + 3]));
  if (ed == 0) {
    p.part_ml[row * 2 * kRowTile + eh] = m;
    p.part_ml[row * 2 * kRowTile + kRowTile + eh] = l;
  }
}

// Stores E consecutive dims of one output head, normalized by `inv`, as bf16.
template <int E>
__device__ __forceinline__ void store_out(uint16_t* dst, const float (&o)[E], float inv) {
  static_assert(E % 4 == 0, "output vectors are at least 8 bytes");
  uint32_t w[E / 2];
#pragma unroll
  for (int e = 0; e < E / 2; ++e) w[e] = ptx::pack_bf16x2(o[2 * e] * inv, o[2 * e + 1] * inv);
  if constexpr (E == 4) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else {
#pragma unroll
    for (int i = 0; i < E / 8; ++i)
      ptx::st_global_u32x4(dst + 8 * i, w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  }
}

}  // namespace flint::detail
