#include "ops/params_from_tensors.h"

#include <algorithm>
#include <cstdint>

namespace flint {

int window_tokens(std::optional<int64_t> window) {
  return window ? static_cast<int>(std::min<int64_t>(*window, INT32_MAX)) : 0;
}

DecodeParams params_from_tensors(const at::Tensor& q, const at::Tensor& kv_cache,
                                 const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                 const at::Tensor& sinks, std::optional<int64_t> window,
                                 double scale, const at::Tensor& out,
                                 const std::optional<at::Tensor>& k_scale,
                                 const std::optional<at::Tensor>& v_scale) {
  DecodeParams p{};
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.kv_cache = kv_cache.data_ptr();
  p.kv_dtype = kv_cache.scalar_type() == at::kFloat8_e4m3fn ? KvDtype::kFp8E4m3 : KvDtype::kBf16;
  if (k_scale) {
    p.k_scale = k_scale->data_ptr<float>();
    p.k_scale_stride = k_scale->size(0) > 1 ? 1 : 0;
  }
  if (v_scale) {
    p.v_scale = v_scale->data_ptr<float>();
    p.v_scale_stride = v_scale->size(0) > 1 ? 1 : 0;
  }
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.sinks = sinks.data_ptr<float>();
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.kv_stride_block = kv_cache.stride(0);
  p.kv_stride_head = kv_cache.stride(1);
  p.bt_stride_b = block_tables.stride(0);
  p.batch = static_cast<int>(q.size(0));
  p.num_kv_heads = static_cast<int>(kv_cache.size(1));
  p.num_blocks = static_cast<int>(kv_cache.size(0));
  p.max_blocks = static_cast<int>(block_tables.size(1));
  p.window = window_tokens(window);
  // Both backends use exactly this float: scale * log2(e) rounded once.
  p.scale_log2 = static_cast<float>(scale * kLog2e);
  return p;
}

}  // namespace flint
