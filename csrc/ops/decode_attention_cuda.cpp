// Torch boundary of the CUDA path: checks, params, launch on the current stream.
#include <torch/library.h>

#include "ops/validation.h"

namespace flint {
namespace {

void decode_attention_cuda(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                           const at::Tensor& out) {
  check_decode_attention_args(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out);
  TORCH_CHECK(false, "flint.decode_attention: the CUDA kernel is not implemented yet");
}

}  // namespace

TORCH_LIBRARY_IMPL(flint, CUDA, m) { m.impl("decode_attention", &decode_attention_cuda); }

}  // namespace flint
