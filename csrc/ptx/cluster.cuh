// Thread-block clusters and distributed shared memory (PTX ISA "barrier.cluster",
// "mapa", "st" with the .shared::cluster state space).
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// barrier.cluster.arrive.relaxed.aligned: arrival that orders no memory.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// barrier.cluster.arrive.release.aligned
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}

// barrier.cluster.wait.acquire.aligned
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// mapa.shared::cluster.u32: the address of `addr` in the shared memory of
// cluster rank `rank`.
__device__ __forceinline__ uint32_t map_shared_rank(uint32_t addr, uint32_t rank) {
  uint32_t peer;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(addr), "r"(rank));
  return peer;
}

// st.shared::cluster.f32
__device__ __forceinline__ void st_cluster_f32(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

// st.shared::cluster.v4.f32 (16-byte aligned address)
__device__ __forceinline__ void st_cluster_f32x4(uint32_t addr, float a, float b, float c,
                                                 float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

}  // namespace flint::ptx
