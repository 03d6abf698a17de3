// The compiled kernels, from the rows of variants.h: row N's description
// (kVariants[N]) and its kernel (variant_entry<N>, instantiated by a .cu of its
// own that setup.py generates; instantiate.cuh). launch_plan.cpp picks among them.
#pragma once

#include "decode_attention/launch_plan.h"

namespace flint {

// A kernel's host stub (for cudaLaunchKernelExC) and its shared memory.
struct KernelEntry {
  const void* fn;
  int smem_bytes;
};

// What a plan names to pick a compiled variant.
struct Variant {
  KernelKind kind;
  KvDtype kv;
  int warps, stages;
  int cluster;  // kCluster: the cluster's size (the plan's splits)
};

// The words of variants.h's rows.
namespace variant_words {
struct Family {
  KernelKind kind;
  int cluster;
};
inline constexpr Family balanced{KernelKind::kBalanced, 0};
inline constexpr Family split{KernelKind::kSplit, 0};
inline constexpr Family cluster4{KernelKind::kCluster, 4};
inline constexpr Family warp_per_head{KernelKind::kWarpPerHead, 0};
inline constexpr KvDtype bf16 = KvDtype::kBf16;
inline constexpr KvDtype fp8 = KvDtype::kFp8E4m3;
}  // namespace variant_words

inline constexpr Variant kVariants[] = {
#define FLINT_VARIANT(family, format, warps, stages)                                         \
  {variant_words::family.kind, variant_words::format, warps, stages, variant_words::family.cluster},
#include "decode_attention/kernels/variants.h"
#undef FLINT_VARIANT
};
inline constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

// Row N's kernel; defined only in row N's own .cu (FLINT_INSTANTIATE(N)): a
// row without one leaves an undefined symbol (the import fails), a .cu
// without a row fails to compile.
template <int N>
struct variant_entry {
  static KernelEntry get();
};

}  // namespace flint
