// Warp-level matrix multiply-accumulate on the tensor cores
// (PTX ISA "Warp Level Matrix Multiply-Accumulate Instructions: mma").
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a b + d.
// Lane (g = lane / 4, t = lane % 4) holds
//   a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]  a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   d    = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]
// with bf16 pairs packed low element first.
__device__ __forceinline__ void mma_m16n8k16_bf16_f32(float (&d)[4], const uint32_t (&a)[4],
                                                      uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: the same with fp16 pairs.
__device__ __forceinline__ void mma_m16n8k16_f16_f32(float (&d)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace flint::ptx
