// Loads, stores, atomics and the few ALU instructions the kernels need in a
// specific form (PTX ISA "ld", "st", "atom", "ex2", "lg2", "prmt", "cvt").
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// ld.shared.v4.b32
__device__ __forceinline__ void ld_shared_u32x4(uint32_t addr, uint32_t (&v)[4]) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr));
}

// ld.global.v4.b32
__device__ __forceinline__ void ld_global_u32x4(const void* ptr, uint32_t (&v)[4]) {
  asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(ptr));
}

// ld.global.cg.v4.f32: cached in L2 only, so data another CTA of this grid
// wrote (and published with a release) is never read from a stale L1 line.
__device__ __forceinline__ float4 ld_global_cg_f32x4(const float* ptr) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(ptr)
               : "memory");
  return v;
}

// ld.global.f32, at its place in the program (volatile: not moved past the
// other asm, e.g. closer to its first use).
__device__ __forceinline__ float ld_global_f32(const float* ptr) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(ptr));
  return v;
}

// ld.global.cg.f32
__device__ __forceinline__ float ld_global_cg_f32(const float* ptr) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(ptr) : "memory");
  return v;
}

// st.global.v4.b32
__device__ __forceinline__ void st_global_u32x4(void* ptr, uint32_t a, uint32_t b, uint32_t c,
                                                uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(a), "r"(b), "r"(c),
               "r"(d)
               : "memory");
}

// st.shared.v2.f32 at a shared-memory address: one 8-byte store (a float2
// stored through a pointer can come out as two 4-byte stores).
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

// atom.add.acq_rel.gpu.s32: returns the old value.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* ptr, int v) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], %2;" : "=r"(old) : "l"(ptr), "r"(v) : "memory");
  return old;
}

// st.relaxed.gpu.s32
__device__ __forceinline__ void st_relaxed_gpu(int* ptr, int v) {
  asm volatile("st.relaxed.gpu.s32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}

// ex2.approx.ftz.f32: 2^x; ex2(-inf) = +0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// lg2.approx.ftz.f32: log2(x); lg2(+inf) = +inf, lg2(+0) = -inf.
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// prmt.b32: bytes of {b, a} picked by the four selector nibbles of `sel`.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// cvt.rn.bf16x2.f32: two floats rounded to bf16, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

}  // namespace flint::ptx
