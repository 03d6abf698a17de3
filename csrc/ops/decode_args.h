// The arguments of one flint::decode_attention call, as the dispatcher hands
// them over. Only dispatcher_entry (below) and the Autograd kernel spell the
// signature out; everything behind them takes this struct. It refers to the caller's tensors: it lives no
// longer than the call.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

#include "decode_attention/params.h"

namespace flint {

struct DecodeArgs {
  const at::Tensor& q;             // [B, H, D] or [B, Q, H, D] bf16
  const at::Tensor& kv_cache;      // [num_blocks, Hkv, 16, 2 D] bf16 or fp8 e4m3
  const at::Tensor& block_tables;  // [B, max_blocks] int32
  const at::Tensor& seq_lens;      // [B] int32
  const std::optional<at::Tensor>& sinks;  // [H] fp32, or none
  std::optional<int64_t> window;
  double scale;
  const at::Tensor& out;           // like q
  const std::optional<at::Tensor>& k_scale;  // fp8 cache only: [1] or [Hkv] fp32
  const std::optional<at::Tensor>& v_scale;
  const std::optional<at::Tensor>& lse;      // q's shape without D, fp32, or none

  // The dims of q and out: 3 for one query token per request, 4 for several.
  bool multi_token() const { return q.dim() == 4; }
  // What the kernels divide a request into (DecodeParams::tiles): its kv
  // heads x the row tiles of a kv head's group x query-token rows.
  int64_t tiles() const {
    const int64_t kv_heads = kv_cache.size(1), tokens = multi_token() ? q.size(1) : 1;
    return kv_heads * row_tiles_of(q.size(-2) / kv_heads, tokens);
  }
};

// A backend that takes DecodeArgs as the dispatcher calls it: the op's
// parameters, spelled out here once for the CPU, CUDA and Meta kernels (the
// Autograd kernel, which also takes the dispatch keys, spells them itself).
template <void (*Backend)(const DecodeArgs&)>
void dispatcher_entry(const at::Tensor& q, const at::Tensor& kv_cache,
                      const at::Tensor& block_tables, const at::Tensor& seq_lens,
                      const std::optional<at::Tensor>& sinks, std::optional<int64_t> window,
                      double scale, const at::Tensor& out,
                      const std::optional<at::Tensor>& k_scale,
                      const std::optional<at::Tensor>& v_scale,
                      const std::optional<at::Tensor>& lse) {
  Backend({q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, k_scale, v_scale, lse});
}

}  // namespace flint
