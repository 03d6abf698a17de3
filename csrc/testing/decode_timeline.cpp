// Test-only op flint_testing::decode_attention_timeline: decode_attention
// launched through the variant that records, per CTA, when it reaches each
// phase (decode_attention/timeline.h) as (%globaltimer ns, %clock64) pairs.
// benchmarks/timeline.py captures chains of it in CUDA graphs to see where a
// call's time goes; its outputs are the operator's.
#include <torch/library.h>

#include "ops/decode_attention_cuda.h"

namespace flint {
namespace {

void decode_attention_timeline(const at::Tensor& q, const at::Tensor& kv_cache,
                               const at::Tensor& block_tables, const at::Tensor& seq_lens,
                               const at::Tensor& sinks, std::optional<int64_t> window,
                               double scale, const at::Tensor& out, const at::Tensor& timeline) {
  decode_attention_cuda_launch(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                               &timeline);
}

}  // namespace

TORCH_LIBRARY_IMPL(flint_testing, CUDA, m) {
  m.impl("decode_attention_timeline", &decode_attention_timeline);
}

}  // namespace flint
