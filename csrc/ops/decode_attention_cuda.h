// The CUDA path of flint::decode_attention, for the diagnostic test op that
// launches it with a timeline (csrc/testing/decode_timeline.cpp).
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace flint {

// Checks, workspace, params and launch on the current stream, as the op does;
// a non-null `timeline` ([>= ctas x kNumStamps x 2] int64 on q's device)
// launches the variant that records the diagnostic timeline into it.
void decode_attention_cuda_launch(const at::Tensor& q, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                  const at::Tensor& sinks, std::optional<int64_t> window,
                                  double scale, const at::Tensor& out,
                                  const at::Tensor* timeline);

}  // namespace flint
