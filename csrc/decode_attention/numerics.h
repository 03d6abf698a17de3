// Numerics the CPU path and the kernels share exactly (host and device).
#pragma once

#include <cstdint>
#include <cstring>

#include "decode_attention/division.h"  // FLINT_HOST_DEVICE

namespace flint {

// fp8 cache path: q is rounded to fp16 after scaling by 2^-e, e the power of
// two that brings the kv head's largest |q| (`max_abs`, NaN skipped) under
// 2^15; 2^e then multiplies the softmax scale. From the float's exponent
// field: 0 below 2^15, and for NaN / Inf 114, which keeps 2^-e and 2^e normal.
FLINT_HOST_DEVICE int q_exponent(float max_abs) {
  uint32_t bits;
  memcpy(&bits, &max_abs, 4);
  const int e = static_cast<int>((bits >> 23) & 0xff) - 141;
  return e < 0 ? 0 : e;
}

// 2^e as a float, exact for -126 <= e <= 127.
FLINT_HOST_DEVICE float exp2i(int e) {
  const uint32_t bits = static_cast<uint32_t>(127 + e) << 23;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

}  // namespace flint
