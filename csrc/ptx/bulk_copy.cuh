// Bulk (non-tensor) asynchronous copies through the copy engine (TMA)
// (PTX ISA "Data Movement and Conversion Instructions: cp.async.bulk").
#pragma once

#include "ptx/arch.cuh"
#include "ptx/mbarrier.cuh"

namespace flint::ptx {

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: global ->
// this CTA's shared memory; completion adds `bytes` to the barrier's tx count.
// Addresses 16-byte aligned, `bytes` a multiple of 16.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Typed form: `dst` a shared-memory buffer, completing on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              Mbarrier& bar) {
  bulk_copy_g2s(smem_addr(dst), src, bytes, smem_addr(&bar));
}

}  // namespace flint::ptx
