// Diagnostic timeline: with kTimeline, thread 0 of every CTA records when the
// CTA reaches each phase, as (%globaltimer ns, %clock64 cycles) pairs in
// p.timeline[cta][stamp]. Only the kTimeline instantiations that the test op
// flint_testing::decode_attention_timeline launches carry these stores; the
// operator's kernels compile without them.
#pragma once

#include <cstdint>

#include "decode_attention/params.h"
#include "decode_attention/timeline.h"
#include "ptx/timer.cuh"

namespace flint::detail {

// This CTA's (ns, clock) pair of stamp s.
__device__ __forceinline__ uint64_t* stamp_slot(const DecodeParams& p, TimelineStamp s) {
  const int64_t cta = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
  return p.timeline + (cta * kNumStamps + s) * 2;
}

template <bool kTimeline>
__device__ __forceinline__ void stamp(const DecodeParams& p, TimelineStamp s) {
  if constexpr (kTimeline) {
    if (threadIdx.x == 0) {
      uint64_t* slot = stamp_slot(p, s);
      slot[0] = ptx::global_timer_ns();
      slot[1] = ptx::sm_clock();
    }
  }
}

// As stamp, once `dep` (a clamped length or block id, never 0xffffffff) has
// arrived: times a load.
template <bool kTimeline>
__device__ __forceinline__ void stamp_after(const DecodeParams& p, TimelineStamp s, int dep) {
  if constexpr (kTimeline) {
    if (threadIdx.x == 0) {
      uint64_t* slot = stamp_slot(p, s);
      ptx::timers_after(static_cast<uint32_t>(dep), slot[0], slot[1]);
    }
  }
}

}  // namespace flint::detail
