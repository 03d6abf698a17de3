// Small device helpers shared by the decode kernel and its merges.
#pragma once

#include <cstdint>

#include "decode_attention/division.h"
#include "decode_attention/params.h"
#include "ptx/memory.cuh"

namespace flint::detail {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

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
