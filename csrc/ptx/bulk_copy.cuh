// Bulk asynchronous copies through the copy engine (TMA): plain byte ranges
// and tensor-map boxes (PTX ISA "Data Movement and Conversion Instructions:
// cp.async.bulk", "cp.async.bulk.tensor").
#pragma once

#include "ptx/arch.cuh"
#include "ptx/mbarrier.cuh"

namespace flint::ptx {

// createpolicy.fractional.L2::evict_first.b64: a cache policy (an opaque
// 64-bit value for .L2::cache_hint) under which every line the access brings
// into L2 is the first to be evicted (PTX ISA "createpolicy"). Not volatile:
// the compiler may compute it once.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// createpolicy.fractional.L2::evict_unchanged.b64: a policy that leaves the
// lines' eviction priority as L2 would set it without a hint.
__device__ __forceinline__ uint64_t l2_evict_unchanged_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint:
// global -> this CTA's shared memory, its L2 lines under `policy`; completion
// adds `bytes` to the barrier's tx count. Addresses 16-byte aligned, `bytes` a
// multiple of 16.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                              uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// Typed form: `dst` a shared-memory buffer, completing on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              Mbarrier& bar, uint64_t policy) {
  bulk_copy_g2s(smem_addr(dst), src, bytes, smem_addr(&bar), policy);
}

// cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint:
// the box of the tensor map `map` at element coordinates (c0, c1, c2, c3),
// innermost first -> this CTA's shared memory at `dst`, laid out (and
// swizzled) as the map says; completion adds the box's bytes to the barrier's
// tx count, its L2 lines under `policy`. `map`: a generic address of a
// CUtensorMap in kernel parameter, constant or global memory; `dst` aligned as
// its swizzle needs (1024 bytes for 128-byte swizzle).
__device__ __forceinline__ void tensor_copy_4d_g2s(uint32_t dst, const void* map, int c0, int c1,
                                                   int c2, int c3, uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(policy)
      : "memory");
}

// prefetch.tensormap: brings the tensor map at generic address `map` into the
// copy engine's descriptor cache ahead of the first copy through it.
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

}  // namespace flint::ptx
