// Every wrapper in this folder is Hopper-only (sm_90a): building device code
// for another architecture is an error here, never a silent no-op.
#pragma once

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
#error "flint's PTX wrappers need sm_90a (build with -gencode=arch=compute_90a,code=sm_90a)"
#endif

#include <cstdint>

namespace flint::ptx {

// Shared-memory address of a generic pointer (the operand form PTX takes).
__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

}  // namespace flint::ptx
