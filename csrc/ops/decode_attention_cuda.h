// The CUDA path of flint::decode_attention, with the launch plan as an
// argument: the op passes the default plan (plan_launch); the test-only
// extension (csrc/testing) passes explicit ones for A/B runs and variant tests.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

#include "decode_attention/launch_plan.h"

namespace flint {

// Checks, workspace, params and launch on the current stream; `plan` null:
// the default plan for the call.
void decode_attention_cuda_launch(const at::Tensor& q, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                  const at::Tensor& sinks, std::optional<int64_t> window,
                                  double scale, const at::Tensor& out,
                                  const std::optional<at::Tensor>& k_scale,
                                  const std::optional<at::Tensor>& v_scale,
                                  const LaunchPlan* plan);

// The default plan of a call on q's device (what the op launches).
LaunchPlan default_plan(const at::Tensor& q, const at::Tensor& kv_cache,
                        std::optional<int64_t> window);

}  // namespace flint
