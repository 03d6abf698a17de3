// Shared memory of the split kernels (kernel_split.cuh) and of the warp-per-head
// kernel (its rings only), as structs: a launch asks for their sizeof.
#pragma once

#include <cstdint>

#include "decode_attention/online_softmax.cuh"
#include "decode_attention/page_ring.cuh"
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
  static constexpr int kM = kSplits * kRowTile * kDimsPerRank;
  static constexpr int kL = kM + kSplits * kRowTile;
  static constexpr int kFloats = kL + kSplits * kRowTile;
};

namespace detail {

// Each warp's ring: kStages page slots of Kv (row `warp` of `ring`, laid out
// as page_ring.cuh's WarpRing), one mbarrier per slot. Once every warp has
// streamed its pages the rings hold the warps' partials for the CTA merge,
// one after another (`partials`). (Row pointers, not WarpRing objects: the
// split kernels' address arithmetic stays that of a flat array.)
template <class Kv, int kWarps, int kStages>
struct RingSmem {
  union {
    alignas(Kv::kSlotAlign) uint8_t ring[kWarps][kStages][Kv::kPageBytes];
    WarpPartial<Kv> partials[kWarps];
  };
  ptx::Mbarrier bars[kWarps][kStages];
  static_assert(sizeof(WarpRing<Kv, kStages>) == sizeof(ring[0]), "a row is a WarpRing");
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

}  // namespace detail
}  // namespace flint
