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

// %globaltimer and %clock64, read only once `dep` is in its register (a
// loaded value whose arrival is being timed): both reads are predicated on a
// comparison with it, so they cannot issue before its load returns. A dep of
// 0xffffffff reads zeros.
__device__ __forceinline__ void timers_after(uint32_t dep, uint64_t& ns, uint64_t& clk) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0xffffffff;\n\tmov.u64 %0, 0;\n\t"
      "mov.u64 %1, 0;\n\t@p mov.u64 %0, %%globaltimer;\n\t@p mov.u64 %1, %%clock64;\n\t}"
      : "=l"(ns), "=l"(clk)
      : "r"(dep)
      : "memory");
}

}  // namespace flint::ptx
