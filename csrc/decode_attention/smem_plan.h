// Shared memory of the split kernels (kernel.cuh) and of the warp-per-head
// kernel (its rings only), as structs: a launch asks for their sizeof.
#pragma once

#include <cstdint>

#include "decode_attention/fragments.cuh"
#include "decode_attention/params.h"
#include "ptx/mbarrier.cuh"

namespace flint {

// Cluster merge buffer of one rank: this rank's 128 / kSplits dims of every
// split's O as [split][head][dim], then m[split][head] and l[split][head].
template <int kSplits>
struct ClusterBufPlan {
  static_assert(kSplits == 0 || kSplits == 4 || kSplits == 8 || kSplits == 16,
                "a cluster rank merges 128 / kSplits dims of every head");
  static constexpr int kDimsPerRank = kSplits > 0 ? kHeadDim / kSplits : 0;
  static constexpr int kM = kSplits * kGqa * kDimsPerRank;
  static constexpr int kL = kM + kSplits * kGqa;
  static constexpr int kFloats = kL + kSplits * kGqa;
};

namespace detail {

// Each warp's ring of kStages page slots (one page of Kv each, one mbarrier
// per slot). Once every warp has streamed its pages the slots hold the warps'
// partials for the CTA merge.
template <class Kv, int kWarps, int kStages>
struct RingSmem {
  static_assert(kStages >= 2, "a ring needs a slot being consumed and one in flight");
  static_assert(sizeof(WarpPartial) <= kStages * Kv::kPageBytes, "a warp's slots hold its partial");
  union {
    alignas(Kv::kSlotAlign) uint8_t ring[kWarps][kStages][Kv::kPageBytes];
    WarpPartial partials[kWarps];
  };
  ptx::Mbarrier bars[kWarps][kStages];
};

// The split kernels: the rings and, with a cluster, this rank's merge buffer
// (ClusterBufPlan), which the peers' DSMEM stores fill while this CTA may
// still stream, so it never aliases the rings.
template <class Kv, int kWarps, int kStages, int kClusterSplits>
struct SplitSmem : RingSmem<Kv, kWarps, kStages> {
  float cluster[ClusterBufPlan<kClusterSplits>::kFloats];
};
template <class Kv, int kWarps, int kStages>
struct SplitSmem<Kv, kWarps, kStages, 0> : RingSmem<Kv, kWarps, kStages> {};

// What one CTA may ask for (sm_90: 227 KB of dynamic shared memory).
constexpr int kMaxSmemPerCta = 227 * 1024;

}  // namespace detail
}  // namespace flint
