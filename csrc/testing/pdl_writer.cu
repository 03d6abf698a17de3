// Test-only op flint_testing::pdl_token_writer: a kernel that behaves like a
// PDL-aware KV-cache writer placed right before decode_attention. It triggers
// its dependents first, waits, then writes q and the new tokens' K/V, so a
// decode kernel that touched q or a new token's page before
// griddepcontrol.wait would read stale values. Used by tests/test_pdl.py; registered in
// ops.cpp.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "ptx/griddepcontrol.cuh"

namespace flint {
namespace {

// The cache in bytes: strides and the row (256 elements) as bytes, so that a
// bf16 and an fp8 cache take the same path.
__global__ void pdl_token_writer_kernel(const uint16_t* src_q, uint16_t* q, int q_elems,
                                        const uint8_t* src_kv, uint8_t* kv,
                                        int64_t kv_stride_block, int64_t kv_stride_head,
                                        int row_bytes, const int32_t* block, const int32_t* row,
                                        int num_kv_heads, int delay_ns) {
  ptx::launch_dependents();
  // Give the dependent grid time to start and run its prologue.
  for (int waited = 0; waited < delay_ns; waited += 1000) __nanosleep(1000);
  const int b = blockIdx.x;  // one (request, new token) slot; q_elems: its q rows
  for (int i = threadIdx.x; i < q_elems; i += blockDim.x)
    q[int64_t(b) * q_elems + i] = src_q[int64_t(b) * q_elems + i];
  for (int i = threadIdx.x; i < num_kv_heads * row_bytes; i += blockDim.x) {
    const int h = i / row_bytes, d = i % row_bytes;
    kv[block[b] * kv_stride_block + h * kv_stride_head + row[b] * row_bytes + d] =
        src_kv[(int64_t(b) * num_kv_heads + h) * row_bytes + d];
  }
}

}  // namespace

// src_q, q: [B, H, 128] or [B, Q, H, 128] contiguous bf16; src_kv: [B Q,
// num_kv_heads, 256] of the cache's dtype; kv_cache: the decode op's cache;
// block, row: [B Q] int32 (the new tokens' slots, request-major).
void pdl_token_writer(const at::Tensor& src_q, const at::Tensor& q, const at::Tensor& src_kv,
                      const at::Tensor& kv_cache, const at::Tensor& block, const at::Tensor& row,
                      int64_t delay_ns) {
  TORCH_CHECK(src_q.is_contiguous() && q.is_contiguous() && src_kv.is_contiguous() &&
                  block.is_contiguous() && row.is_contiguous(),
              "pdl_token_writer: contiguous inputs only");
  TORCH_CHECK(src_kv.scalar_type() == kv_cache.scalar_type(),
              "pdl_token_writer: src_kv must have kv_cache's dtype");
  const int64_t elem = kv_cache.element_size();
  const c10::cuda::CUDAGuard guard(q.device());
  const int slots = static_cast<int>(block.size(0));
  if (slots == 0) return;
  TORCH_CHECK(q.numel() % slots == 0 && row.size(0) == slots && src_kv.size(0) == slots,
              "pdl_token_writer: one block, row and src_kv row per (request, new token)");
  pdl_token_writer_kernel<<<slots, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const uint16_t*>(src_q.data_ptr()), reinterpret_cast<uint16_t*>(q.data_ptr()),
      static_cast<int>(q.numel() / slots), static_cast<const uint8_t*>(src_kv.data_ptr()),
      static_cast<uint8_t*>(kv_cache.data_ptr()), kv_cache.stride(0) * elem,
      kv_cache.stride(1) * elem, static_cast<int>(256 * elem), block.data_ptr<int32_t>(),
      row.data_ptr<int32_t>(), static_cast<int>(kv_cache.size(1)), static_cast<int>(delay_ns));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace flint
