// DecodeParams from the op's (validated) arguments: the one place both
// backends read pointers, strides and sizes from.
#pragma once

#include <optional>

#include "decode_attention/params.h"
#include "ops/decode_args.h"

namespace flint {

// The op's window in tokens, 0 for none; past INT32_MAX clamped (seq_lens are
// int32, so any such window attends to everything).
int window_tokens(std::optional<int64_t> window);

// Fills everything but the workspace pointers and min_pages (CUDA launch
// details); the window as window_tokens.
DecodeParams params_from_tensors(const DecodeArgs& args);

}  // namespace flint
