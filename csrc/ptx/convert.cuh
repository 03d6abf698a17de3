// Conversions to and from fp16 for the fp8 cache path (PTX ISA "cvt").
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// cvt.rn.f16x2.e4m3x2, twice: four e4m3 values (bytes 0..3 of x) to fp16
// pairs, bytes 0-1 into lo, 2-3 into hi (low byte first in each). Exact: every
// e4m3 value (NaN included) is an fp16 value. The halves are split inside the
// asm (mov.b32 {a, b}), so ptxas reads the high one in place instead of
// shifting it down first.
__device__ __forceinline__ void cvt_f16x4_e4m3x4(uint32_t x, uint32_t& lo, uint32_t& hi) {
  asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
      : "=r"(lo), "=r"(hi)
      : "r"(x));
}

// cvt.rn.f16x2.f32: two floats rounded to fp16 (subnormals kept), `lo` in the
// low half.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

}  // namespace flint::ptx
