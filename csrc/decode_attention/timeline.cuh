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

template <bool kTimeline>
__device__ __forceinline__ void stamp(const DecodeParams& p, TimelineStamp s) {
  if constexpr (kTimeline) {
    if (threadIdx.x == 0) {
      const int64_t cta = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
      uint64_t* slot = p.timeline + (cta * kNumStamps + s) * 2;
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
      const int64_t cta = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
      uint64_t* slot = p.timeline + (cta * kNumStamps + s) * 2;
      ptx::timers_after(static_cast<uint32_t>(dep), slot[0], slot[1]);
    }
  }
}

}  // namespace flint::detail
