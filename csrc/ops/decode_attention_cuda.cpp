// Torch boundary of the CUDA path: checks, workspace, params, launch on the
// current stream.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "decode_attention/launch.h"
#include "decode_attention/timeline.h"
#include "ops/decode_attention_cuda.h"
#include "ops/params_from_tensors.h"
#include "ops/validation.h"
#include "ops/workspace.h"

namespace flint {
namespace {

// FLINT_LAUNCH_CONFIG="splits,warps,stages,min_pages,cluster" overrides the
// heuristic for every launch while set (the benchmark's tuning mode).
LaunchConfig launch_config(int batch, int num_kv_heads, bool sliding, int64_t max_tokens,
                           int num_sms) {
  const char* env = std::getenv("FLINT_LAUNCH_CONFIG");
  if (env == nullptr || *env == '\0')
    return default_launch_config(batch, num_kv_heads, sliding, max_tokens, num_sms);
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

// FLINT_REFILL_AFTER_WAIT=0 / =1 / =2 overrides the launch's choice (A/B runs).
int refill_after_wait() {
  const char* env = std::getenv("FLINT_REFILL_AFTER_WAIT");
  if (env == nullptr) return -1;
  const std::string v(env);
  TORCH_CHECK(v == "0" || v == "1" || v == "2", "flint.decode_attention: "
              "FLINT_REFILL_AFTER_WAIT must be 0, 1 or 2, got '", v, "'");
  return v[0] - '0';
}

bool pdl_enabled() {
  const char* env = std::getenv("FLINT_PDL");
  return env == nullptr || std::string(env) != "0";
}

}  // namespace

void decode_attention_cuda_launch(const at::Tensor& q, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                  const at::Tensor& sinks, std::optional<int64_t> window,
                                  double scale, const at::Tensor& out,
                                  const at::Tensor* timeline) {
  check_decode_attention_args(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                              std::nullopt, std::nullopt);
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
  TORCH_CHECK(num_kv_heads <= 65535, "flint.decode_attention: num_kv_heads must be <= 65535 on "
              "the GPU (grid y), got ", num_kv_heads);

  const bool sliding = window.has_value();
  const LaunchConfig cfg = launch_config(batch, num_kv_heads, sliding,
                                         block_tables.size(1) * kPageTokens,
                                         props->multiProcessorCount);
  const std::string bad = check_launch_config(cfg, timeline != nullptr);
  TORCH_CHECK(bad.empty(), "flint.decode_attention: unsupported launch configuration: ", bad);

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // Held until the launch is queued (end of scope).
  const WorkspaceLease lease = lease_workspace(q.device(), stream);
  const Workspace& ws = lease.ws;
  const int64_t num_bh = batch * num_kv_heads;
  if (cfg.num_splits > 1 && !cfg.cluster) {
    TORCH_CHECK(num_bh * cfg.num_splits <= ws.max_partials, "flint.decode_attention: the "
                "workspace holds ", ws.max_partials, " split partials; batch ", batch, " x ",
                num_kv_heads, " kv heads x ", cfg.num_splits, " splits needs ",
                num_bh * cfg.num_splits);
  }

  DecodeParams p =
      params_from_tensors(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                          std::nullopt, std::nullopt);
  p.part_o = ws.part_o;
  p.part_ml = ws.part_ml;
  p.counters = ws.counters;
  // With no blocks at all nothing can be attended: every request writes zeros.
  if (p.num_blocks == 0) p.max_blocks = 0;
  p.min_pages = cfg.min_pages;
  p.refill_after_wait = refill_after_wait();
  if (timeline != nullptr) {
    const int64_t ctas = num_ctas(p, cfg);
    const int64_t need = ctas * kNumStamps * 2;
    TORCH_CHECK(timeline->is_cuda() && timeline->device() == q.device() &&
                    timeline->scalar_type() == at::kLong && timeline->is_contiguous() &&
                    timeline->numel() >= need,
                "decode_attention_timeline: timeline must be a contiguous int64 tensor on ",
                q.device(), " with at least ", need, " elements (", ctas,
                " CTAs x ", static_cast<int>(kNumStamps), " stamps x 2)");
    p.timeline = reinterpret_cast<uint64_t*>(timeline->data_ptr<int64_t>());
  }

  C10_CUDA_CHECK(launch_decode_attention(p, cfg, sliding, pdl_enabled(), stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

namespace {

void decode_attention_cuda(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                           const at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                           const std::optional<at::Tensor>& v_scale) {
  check_decode_attention_args(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                              k_scale, v_scale);
  TORCH_CHECK(kv_cache.scalar_type() == at::kBFloat16, "flint.decode_attention: the CUDA kernel "
              "does not take an fp8 kv_cache yet");
  decode_attention_cuda_launch(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                               nullptr);
}

}  // namespace

TORCH_LIBRARY_IMPL(flint, CUDA, m) { m.impl("decode_attention", &decode_attention_cuda); }

}  // namespace flint
