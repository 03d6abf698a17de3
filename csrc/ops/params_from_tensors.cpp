#include "ops/params_from_tensors.h"

#include <algorithm>
#include <cstdint>

namespace flint {

int window_tokens(std::optional<int64_t> window) {
  return window ? static_cast<int>(std::min<int64_t>(*window, INT32_MAX)) : 0;
}

DecodeParams params_from_tensors(const DecodeArgs& a) {
  const at::Tensor& q = a.q;
  const at::Tensor& out = a.out;
  const at::Tensor& kv_cache = a.kv_cache;
  // [B, H, D] is [B, 1, H, D]: the token stride is never used.
  const bool multi = a.multi_token();
  DecodeParams p{};
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.kv_cache = kv_cache.data_ptr();
  p.kv_dtype = kv_cache.scalar_type() == at::kFloat8_e4m3fn ? KvDtype::kFp8E4m3 : KvDtype::kBf16;
  if (a.k_scale) {
    p.k_scale = a.k_scale->data_ptr<float>();
    p.k_scale_stride = a.k_scale->size(0) > 1 ? 1 : 0;
  }
  if (a.v_scale) {
    p.v_scale = a.v_scale->data_ptr<float>();
    p.v_scale_stride = a.v_scale->size(0) > 1 ? 1 : 0;
  }
  p.block_tables = a.block_tables.data_ptr<int32_t>();
  p.seq_lens = a.seq_lens.data_ptr<int32_t>();
  p.sinks = a.sinks ? a.sinks->data_ptr<float>() : nullptr;
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(-2);
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(-2);
  p.kv_stride_block = kv_cache.stride(0);
  p.kv_stride_head = kv_cache.stride(1);
  p.bt_stride_b = a.block_tables.stride(0);
  p.batch = static_cast<int>(q.size(0));
  p.num_kv_heads = static_cast<int>(kv_cache.size(1));
  p.num_blocks = static_cast<int>(kv_cache.size(0));
  p.max_blocks = static_cast<int>(a.block_tables.size(1));
  p.window = window_tokens(a.window);
  // Both backends use exactly this float: scale * log2(e) rounded once.
  p.scale_log2 = static_cast<float>(a.scale * kLog2e);

  p.head_dim = static_cast<int>(q.size(-1));
  p.group = static_cast<int>(q.size(-2) / kv_cache.size(1));
  p.q_tokens = multi ? static_cast<int>(q.size(1)) : 1;
  set_tiles(p);
  p.q_stride_t = multi ? q.stride(1) : 0;
  p.out_stride_t = multi ? out.stride(1) : 0;
  if (a.lse) {
    const at::Tensor& lse = *a.lse;
    p.lse = lse.data_ptr<float>();
    p.lse_stride_b = lse.stride(0);
    p.lse_stride_t = multi ? lse.stride(1) : 0;
    p.lse_stride_h = lse.stride(-1);
  }
  return p;
}

}  // namespace flint
