// Conversions of fp8 cache elements (PTX ISA "cvt").
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// cvt.rn.f16x2.e4m3x2: two e4m3 values (low byte first) to two fp16, low half
// first. Exact: every e4m3 value (NaN included) is an fp16 value.
__device__ __forceinline__ uint32_t cvt_f16x2_e4m3x2(uint16_t pair) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(pair));
  return d;
}

// cvt.f32.f16: exact.
__device__ __forceinline__ float cvt_f32_f16(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

}  // namespace flint::ptx
