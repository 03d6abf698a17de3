// Torch boundary of the CUDA path: checks, workspace, params, launch on the
// current stream.
#include "ops/decode_attention_cuda.h"

#include <cstdlib>
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "decode_attention/hopper.h"
#include "ops/params_from_tensors.h"
#include "ops/validation.h"
#include "ops/workspace.h"

namespace flint {
namespace {

// FLINT_PDL=0 launches without programmatic dependent launch, for an engine
// whose kernel right before this one writes seq_lens, block tables or sinks
// (README). Read once, at the first call.
bool pdl_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("FLINT_PDL");
    return env == nullptr || std::string(env) != "0";
  }();
  return enabled;
}

KvDtype kv_dtype(const at::Tensor& kv_cache) {
  return kv_cache.scalar_type() == at::kFloat8_e4m3fn ? KvDtype::kFp8E4m3 : KvDtype::kBf16;
}

}  // namespace

LaunchPlan default_plan(const DecodeArgs& a) {
  const int sms = at::cuda::getDeviceProperties(a.q.device().index())->multiProcessorCount;
  LaunchPlan plan = plan_launch(static_cast<int>(a.q.size(0)), static_cast<int>(a.tiles()),
                                window_tokens(a.window), kv_dtype(a.kv_cache), sms);
  plan.pdl = pdl_enabled();
  return plan;
}

void decode_attention_cuda_launch(const DecodeArgs& args, const LaunchPlan* given_plan) {
  check_decode_attention_args(args);
  const at::Tensor& q = args.q;
  const at::Tensor& kv_cache = args.kv_cache;
  const int64_t batch = q.size(0);
  // The head_dim the CUDA kernels are compiled for; the CPU path takes the rest.
  TORCH_CHECK(q.size(-1) == kHeadDim, "flint.decode_attention: the CUDA kernels of this build "
              "serve head_dim ", kHeadDim, "; got ", q.size(-1), ". The CPU path (CPU tensors) "
              "serves head_dim 64, 128 and 256.");
  if (batch == 0) return;

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(props->major == 9, "flint.decode_attention: the CUDA kernel needs a Hopper GPU "
              "(sm_90); ", q.device(), " is ", props->name, " (sm_", props->major, props->minor,
              "). Run on CPU tensors for the reference path.");
  const LaunchPlan plan = given_plan ? *given_plan : default_plan(args);
  TORCH_CHECK(plan.kv == kv_dtype(kv_cache), "flint.decode_attention: the launch plan is for ",
              plan.kv == KvDtype::kBf16 ? "a bf16" : "an fp8", " cache, kv_cache is ",
              kv_cache.scalar_type());
  const std::string bad = check_plan(plan);
  TORCH_CHECK(bad.empty(), "flint.decode_attention: unsupported launch plan: ", bad);
  if (plan.kind == KernelKind::kSplit || plan.kind == KernelKind::kCluster) {
    TORCH_CHECK(batch <= hopper::kMaxGridYZ && args.tiles() <= hopper::kMaxGridYZ,
                "flint.decode_attention: the split kernels need batch and num_kv_heads x "
                "ceil(group x query tokens / 8) <= ", hopper::kMaxGridYZ, " (their grid), got ",
                batch, " and ", args.tiles());
  }

  DecodeParams p = params_from_tensors(args);
  // With no blocks at all nothing can be attended: every request writes zeros.
  if (p.num_blocks == 0) p.max_blocks = 0;

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  LaunchShape shape{};
  C10_CUDA_CHECK(launch_shape(p, plan, q.device().index(), &shape));
  // Held until the launch is queued (end of scope).
  const WorkspaceLease lease = lease_workspace(q.device(), stream);
  const Workspace& ws = lease.ws;
  TORCH_CHECK(shape.partials <= ws.max_partials && shape.counters <= ws.max_counters,
              "flint.decode_attention: the workspace holds ", ws.max_partials, " partials and ",
              ws.max_counters, " counters; this launch needs ", shape.partials, " and ",
              shape.counters);
  p.part_o = ws.part_o;
  p.part_ml = ws.part_ml;
  p.counters = ws.counters;
  const cudaError_t err = launch_decode_attention(p, plan, stream);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // what a refused launch left behind, so later calls do not see it
    TORCH_CHECK(false, "flint.decode_attention: the launch failed: ", cudaGetErrorString(err),
                p.kv_dtype == KvDtype::kFp8E4m3
                    ? " (an fp8 kv_cache is copied through a tensor map of it, which needs its "
                      "strides below 2^40 bytes and the driver's cuTensorMapEncodeTiled)"
                    : "");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

namespace {

void decode_attention_cuda(const DecodeArgs& args) { decode_attention_cuda_launch(args, nullptr); }

}  // namespace

TORCH_LIBRARY_IMPL(flint, CUDA, m) {
  m.impl("decode_attention", &dispatcher_entry<&decode_attention_cuda>);
}

}  // namespace flint
