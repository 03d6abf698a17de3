// Small device helpers shared by the decode kernel and its merges.
#pragma once

#include <cstdint>

#include "decode_attention/params.h"
#include "ptx/memory.cuh"

namespace flint::detail {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// One request's attended span: tokens [start_tok, seq_len), pages start_page
// + k for k < num_pages (num_pages <= 0: nothing to attend). An
// out-of-contract length is clamped so that no read leaves the block table or
// the cache.
struct SeqExtent {
  int seq_len, start_tok, start_page, num_pages;
};

__device__ __forceinline__ SeqExtent seq_extent(const DecodeParams& p, int raw_len) {
  SeqExtent e;
  e.seq_len = min(max(raw_len, 0), p.max_blocks * kPageTokens);
  e.start_tok = p.window > 0 ? max(e.seq_len - p.window, 0) : 0;
  e.start_page = e.start_tok / kPageTokens;
  e.num_pages = (e.seq_len + kPageTokens - 1) / kPageTokens - e.start_page;
  return e;
}

// Weight of a partial with max m against the merged scaled max: 0 for a
// partial that saw no token (m = -inf).
__device__ __forceinline__ float rescale(float m, float scale_log2, float m_scaled) {
  return m == neg_inf() ? 0.f : ptx::ex2(fmaf(m, scale_log2, -m_scaled));
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
