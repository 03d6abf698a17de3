// Torch boundary of the CUDA path: checks, workspace, params, launch on the
// current stream.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "decode_attention/launch.h"
#include "ops/validation.h"
#include "ops/workspace.h"

namespace flint {
namespace {

// FLINT_LAUNCH_CONFIG="splits,warps,stages,min_pages,cluster" overrides the
// heuristic for every launch while set (the benchmark's tuning mode).
LaunchConfig launch_config(int batch, int num_kv_heads, bool sliding, int num_sms) {
  const char* env = std::getenv("FLINT_LAUNCH_CONFIG");
  if (env == nullptr || *env == '\0') return default_launch_config(batch, num_kv_heads, sliding, num_sms);
  LaunchConfig cfg{};
  int cluster = 0;
  char tail = 0;
  const int n = std::sscanf(env, "%d,%d,%d,%d,%d%c", &cfg.num_splits, &cfg.num_warps,
                            &cfg.num_stages, &cfg.min_pages, &cluster, &tail);
  TORCH_CHECK(n == 5 && (cluster == 0 || cluster == 1), "flint.decode_attention: "
              "FLINT_LAUNCH_CONFIG must be 'splits,warps,stages,min_pages,cluster' "
              "(cluster 0 or 1), got '", env, "'");
  cfg.cluster = cluster == 1;
  return cfg;
}

bool pdl_enabled() {
  const char* env = std::getenv("FLINT_PDL");
  return env == nullptr || std::string(env) != "0";
}

void decode_attention_cuda(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                           const at::Tensor& out) {
  check_decode_attention_args(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out);
  const int64_t batch = q.size(0);
  if (batch == 0) return;
  const int64_t num_kv_heads = kv_cache.size(1);

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(props->major == 9, "flint.decode_attention: the CUDA kernel needs a Hopper GPU "
              "(sm_90); ", q.device(), " is ", props->name, " (sm_", props->major, props->minor,
              "). Run on CPU tensors for the reference path.");
  TORCH_CHECK(batch <= 65535, "flint.decode_attention: batch must be <= 65535 on the GPU "
              "(grid z), got ", batch);
  TORCH_CHECK(num_kv_heads <= 65535, "flint.decode_attention: num_kv_heads must be <= 65535, "
              "got ", num_kv_heads);
  TORCH_CHECK(block_tables.size(1) <= INT32_MAX / kPageTokens && kv_cache.size(0) <= INT32_MAX,
              "flint.decode_attention: 16 * max_blocks and num_blocks must fit int32, got "
              "block_tables ", block_tables.sizes(), " and kv_cache ", kv_cache.sizes());

  const bool sliding = window.has_value();
  const LaunchConfig cfg = launch_config(batch, num_kv_heads, sliding, props->multiProcessorCount);
  const std::string bad = check_launch_config(cfg);
  TORCH_CHECK(bad.empty(), "flint.decode_attention: unsupported launch configuration: ", bad);

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Workspace& ws = workspace_for(q.device(), stream);
  const int64_t num_bh = batch * num_kv_heads;
  if (cfg.num_splits > 1 && !cfg.cluster) {
    TORCH_CHECK(num_bh * cfg.num_splits <= ws.max_partials, "flint.decode_attention: the "
                "workspace holds ", ws.max_partials, " split partials; batch ", batch, " x ",
                num_kv_heads, " kv heads x ", cfg.num_splits, " splits needs ",
                num_bh * cfg.num_splits);
  }

  DecodeParams p{};
  p.q = reinterpret_cast<const uint16_t*>(q.data_ptr());
  p.kv_cache = reinterpret_cast<const uint16_t*>(kv_cache.data_ptr());
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.sinks = sinks.data_ptr<float>();
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  p.part_o = ws.part_o;
  p.part_ml = ws.part_ml;
  p.counters = ws.counters;
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.kv_stride_block = kv_cache.stride(0);
  p.kv_stride_head = kv_cache.stride(1);
  p.bt_stride_b = block_tables.stride(0);
  p.batch = static_cast<int>(batch);
  p.num_kv_heads = static_cast<int>(num_kv_heads);
  p.num_blocks = static_cast<int>(kv_cache.size(0));
  // With no blocks at all nothing can be attended: every request writes zeros.
  p.max_blocks = p.num_blocks == 0 ? 0 : static_cast<int>(block_tables.size(1));
  // Any window >= 16 * max_blocks attends to everything; int32 holds them all.
  p.window = sliding ? static_cast<int>(std::min<int64_t>(*window, INT32_MAX)) : 0;
  p.min_pages = cfg.min_pages;
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);

  C10_CUDA_CHECK(launch_decode_attention(p, cfg, sliding, pdl_enabled(), stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(flint, CUDA, m) { m.impl("decode_attention", &decode_attention_cuda); }

}  // namespace flint
