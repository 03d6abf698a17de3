// Row N of variants.h compiled: setup.py generates, for each row, a .cu of
// `#include "decode_attention/kernels/instantiate.cuh"` and FLINT_INSTANTIATE(N).
#pragma once

#include <type_traits>

#include "decode_attention/kernel_split.cuh"
#include "decode_attention/kernel_balanced.cuh"
#include "decode_attention/kernel_warp_per_head.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

template <int N>
KernelEntry variant_entry<N>::get() {
  static_assert(N >= 0 && N < kNumVariants, "FLINT_INSTANTIATE(N): no row N in variants.h");
  constexpr Variant v = kVariants[N];
  using Kv = std::conditional_t<v.kv == KvDtype::kBf16, detail::KvBf16, detail::KvFp8>;
  if constexpr (v.kind == KernelKind::kBalanced)
    return balanced_entry<Kv, v.warps, v.stages>();
  else if constexpr (v.kind == KernelKind::kWarpPerHead)
    return warp_per_head_entry<Kv, v.warps, v.stages>();
  else
    return split_entry<Kv, v.warps, v.stages, v.cluster>();
}

}  // namespace flint

#define FLINT_INSTANTIATE(N) template struct flint::variant_entry<N>;
