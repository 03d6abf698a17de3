#include "decode_attention/launch.h"

#include <algorithm>
#include <atomic>

#include "decode_attention/kernel.cuh"

namespace flint {
namespace {

using KernelFn = void (*)(DecodeParams);

struct Variant {
  int warps, stages, cluster_splits;
  KernelFn kernel;
  int smem_bytes;        // SmemPlan::kBytes
  int max_merge_splits;  // SmemPlan::kMaxMergeSplits
};

template <int W, int S, int C>
constexpr Variant variant() {
  using Plan = SmemPlan<W, S, C>;
  return {W, S, C, &decode_attention_kernel<W, S, C>, Plan::kBytes, Plan::kMaxMergeSplits};
}

// The compiled variants: the reference heuristic's choices plus neighbours for
// tuning (FLINT_LAUNCH_CONFIG).
constexpr Variant kVariants[] = {
    variant<4, 2, 0>(), variant<4, 3, 0>(), variant<4, 4, 0>(),
    variant<8, 2, 0>(), variant<8, 3, 0>(),
    variant<4, 2, 4>(), variant<4, 3, 4>(), variant<4, 2, 8>(), variant<4, 3, 8>(),
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

const Variant* find_variant(const LaunchConfig& cfg) {
  for (const Variant& v : kVariants) {
    if (v.warps == cfg.num_warps && v.stages == cfg.num_stages &&
        v.cluster_splits == (cfg.cluster ? cfg.num_splits : 0))
      return &v;
  }
  return nullptr;
}

// Dynamic shared memory above 48 KB must be opted into, once per kernel and device.
cudaError_t allow_smem(const Variant& v, int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kNumVariants][kMaxDevices] = {};
  const int idx = static_cast<int>(&v - kVariants);
  if (device < kMaxDevices && done[idx][device].load(std::memory_order_relaxed)) return cudaSuccess;
  int max_optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_optin);
  if (err == cudaSuccess && device < kMaxDevices) done[idx][device] = true;
  return err;
}

}  // namespace

std::string check_launch_config(const LaunchConfig& cfg) {
  const Variant* v = find_variant(cfg);
  if (v == nullptr) {
    std::string have;
    for (const Variant& k : kVariants)
      have += " (warps " + std::to_string(k.warps) + ", stages " + std::to_string(k.stages) +
              (k.cluster_splits ? ", cluster of " + std::to_string(k.cluster_splits) : "") + ")";
    return "no compiled kernel for " + std::to_string(cfg.num_warps) + " warps, " +
           std::to_string(cfg.num_stages) + " stages" +
           (cfg.cluster ? ", cluster of " + std::to_string(cfg.num_splits) : "") +
           "; compiled:" + have;
  }
  if (cfg.num_splits < 1 || cfg.min_pages < 1)
    return "num_splits and min_pages must be >= 1, got " + std::to_string(cfg.num_splits) +
           " and " + std::to_string(cfg.min_pages);
  if (!cfg.cluster && cfg.num_splits > v->max_merge_splits)
    return "at most " + std::to_string(v->max_merge_splits) + " splits fit the merge buffer of " +
           std::to_string(cfg.num_warps) + " warps x " + std::to_string(cfg.num_stages) +
           " stages, got " + std::to_string(cfg.num_splits);
  return {};
}

cudaError_t launch_decode_attention(const DecodeParams& params, const LaunchConfig& cfg,
                                    bool sliding, bool pdl, cudaStream_t stream) {
  const Variant& v = *find_variant(cfg);  // callers check_launch_config first
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = allow_smem(v, device);
  if (err != cudaSuccess) return err;

  int smem = v.smem_bytes;
  if (!sliding) {
    // Pad shared memory so that at most 8 / num_warps CTAs share an SM: with
    // PDL the next grid's CTAs launch while this one drains and would
    // otherwise pile onto the first SMs to free up.
    const int ctas_per_sm = std::max(1, 8 / cfg.num_warps);
    smem = std::max(smem, kSmemPerSm / (ctas_per_sm + 1) + 1);
  }

  cudaLaunchConfig_t launch = {};
  launch.gridDim = dim3(cfg.num_splits, params.num_kv_heads, params.batch);
  launch.blockDim = dim3(32 * cfg.num_warps);
  launch.dynamicSmemBytes = smem;
  launch.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cfg.cluster) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cfg.num_splits;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  launch.attrs = attrs;
  launch.numAttrs = n;
  return cudaLaunchKernelEx(&launch, v.kernel, params);
}

}  // namespace flint
