// DecodeParams from the op's (validated) tensors: the one place both backends
// read pointers, strides and sizes from.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

#include "decode_attention/params.h"

namespace flint {

// The op's window in tokens, 0 for none; past INT32_MAX clamped (seq_lens are
// int32, so any such window attends to everything).
int window_tokens(std::optional<int64_t> window);

// Fills everything but the workspace pointers and min_pages (CUDA launch
// details); the window as window_tokens.
DecodeParams params_from_tensors(const at::Tensor& q, const at::Tensor& kv_cache,
                                 const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                 const at::Tensor& sinks, std::optional<int64_t> window,
                                 double scale, const at::Tensor& out,
                                 const std::optional<at::Tensor>& k_scale,
                                 const std::optional<at::Tensor>& v_scale);

}  // namespace flint
