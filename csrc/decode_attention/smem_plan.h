// Shared-memory layout of the split kernels (kernel.cuh) and of the
// warp-per-head kernel's rings.
#pragma once

#include "decode_attention/params.h"

namespace flint {

// Cluster merge buffer of one rank, filled by the peers' DSMEM stores while
// this CTA may still stream, so it never aliases the ring: this rank's
// 128 / kSplits dims of every split's O as [split][head][dim], then
// m[split][head] and l[split][head].
template <int kSplits>
struct ClusterBufPlan {
  static_assert(kSplits == 0 || kSplits == 4 || kSplits == 8 || kSplits == 16,
                "a cluster rank merges 128 / kSplits dims of every head");
  static constexpr int kDimsPerRank = kSplits > 0 ? kHeadDim / kSplits : 0;
  static constexpr int kM = kSplits * kGqa * kDimsPerRank;
  static constexpr int kL = kM + kSplits * kGqa;
  static constexpr int kFloats = kL + kSplits * kGqa;
};

// kSlotBytes: one page of the cache's format (8 KB bf16, 4 KB fp8).
template <int kWarps, int kStages, int kClusterSplits, int kSlotBytes>
struct SmemPlan {
  static_assert(kWarps == 4 || kWarps >= 8, "the epilogue maps 1024 outputs onto 128 or 256 threads");
  static_assert(kClusterSplits == 0 || kWarps <= 8, "every thread of a cluster rank merges");

  // Warps that run the epilogue (CTA merge onwards): all of them up to 8;
  // beyond 8 the others only stream pages (more warps per split, so fewer
  // splits and CTAs give each warp the same pages).
  static constexpr int kMergeWarps = kWarps < 8 ? kWarps : 8;
  static_assert(kStages >= 2, "a ring needs a slot being consumed and one in flight");

  // Page ring: kStages slots per warp, one mbarrier per slot. After
  // streaming, the ring holds the warps' partials for the CTA merge
  // (kernel.cuh).
  static constexpr int kWarpRingBytes = kStages * kSlotBytes;
  static constexpr int kRingBytes = kWarps * kWarpRingBytes;
  static constexpr int kBarOffset = kRingBytes;
  static constexpr int kClusterOffset = kBarOffset + kWarps * kStages * 8;
  static constexpr int kBytes = kClusterOffset + ClusterBufPlan<kClusterSplits>::kFloats * 4;

  static_assert(kWarpRingBytes % 128 == 0 && kClusterOffset % 16 == 0, "alignment");
  static_assert(kBytes <= 227 * 1024, "fits one CTA's shared memory");
};

}  // namespace flint
