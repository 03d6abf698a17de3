// Clocks for the diagnostic timeline (PTX ISA "Special Registers": %globaltimer,
// %clock64).
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// %globaltimer: nanoseconds, one clock for every SM of the GPU.
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// %clock64: this SM's cycle counter (not comparable across SMs).
__device__ __forceinline__ uint64_t sm_clock() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}

}  // namespace flint::ptx
