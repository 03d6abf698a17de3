// The GPU's clocks, for the testing extension's phase stamps (PTX ISA
// "Special Registers": %globaltimer, %clock64). The operator's kernels never read them.
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// %globaltimer: nanoseconds, one clock for every SM of the GPU.
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// %clock64: this SM's cycle counter (durations within one warp).
__device__ __forceinline__ uint64_t clock_cycles() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}

}  // namespace flint::ptx
