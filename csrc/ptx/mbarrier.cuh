// mbarrier: shared-memory barriers that count arrivals and transaction bytes
// (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier").
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// An mbarrier object in shared memory. The typed overloads below take one, so
// that a barrier and a shared-memory address cannot be swapped silently.
struct alignas(8) Mbarrier {
  uint64_t state;
};

// mbarrier.init.shared::cta.b64
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// fence.mbarrier_init.release.cluster: makes the inits visible to the async
// proxy (bulk copies complete on them) and to the other CTAs of a cluster.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// mbarrier.arrive.expect_tx.shared::cta.b64: one arrival, and `bytes` more
// bytes of transactions the current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// mbarrier.try_wait.parity.shared::cta.b64, retried until the phase with
// parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "retry:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra retry;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// mbarrier.test_wait.parity.shared::cta.b64: whether the phase with parity
// `parity` has completed, without waiting.
__device__ __forceinline__ bool mbarrier_test_parity(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Typed forms of the above.
__device__ __forceinline__ void mbarrier_init(Mbarrier& bar, uint32_t arrivals) {
  mbarrier_init(smem_addr(&bar), arrivals);
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(Mbarrier& bar, uint32_t bytes) {
  mbarrier_arrive_expect_tx(smem_addr(&bar), bytes);
}
__device__ __forceinline__ void mbarrier_wait_parity(Mbarrier& bar, uint32_t parity) {
  mbarrier_wait_parity(smem_addr(&bar), parity);
}
__device__ __forceinline__ bool mbarrier_test_parity(Mbarrier& bar, uint32_t parity) {
  return mbarrier_test_parity(smem_addr(&bar), parity);
}

}  // namespace flint::ptx
