#include "decode_attention/launch.h"

#include <algorithm>
#include <atomic>

#include "decode_attention/kernel.cuh"
#include "decode_attention/kernel_warp_per_head.cuh"

namespace flint {
namespace {

using KernelFn = void (*)(DecodeParams);

struct Variant {
  int warps, stages, cluster_splits;
  bool warp_per_head;    // decode_attention_warp_per_head_kernel (num_splits 0)
  bool timeline;         // records the diagnostic timeline (params.timeline)
  KernelFn kernel;
  int smem_bytes;        // SmemPlan::kBytes
};

template <int W, int S, int C, bool T = false>
constexpr Variant variant() {
  using Plan = SmemPlan<W, S, C>;
  return {W, S, C, false, T, &decode_attention_kernel<W, S, C, T>, Plan::kBytes};
}

template <int W, int S, bool T = false>
constexpr Variant warp_per_head_variant() {
  using Plan = SmemPlan<W, S, 0>;
  return {W, S, 0, true, T, &decode_attention_warp_per_head_kernel<W, S, T>, Plan::kBytes};
}

// The compiled variants: the reference heuristic's choices plus neighbours for
// tuning (FLINT_LAUNCH_CONFIG), and the warp-per-head kernel.
constexpr Variant kVariants[] = {
    variant<4, 2, 0>(), variant<4, 3, 0>(), variant<4, 4, 0>(),
    variant<8, 2, 0>(), variant<8, 3, 0>(), variant<9, 2, 0>(), variant<10, 2, 0>(),
    variant<4, 2, 4>(), variant<4, 3, 4>(), variant<4, 2, 8>(), variant<4, 3, 8>(),
    variant<8, 2, 4>(), variant<8, 3, 4>(), variant<8, 2, 8>(), variant<8, 3, 8>(),
    variant<4, 3, 16>(), variant<8, 2, 16>(),
    warp_per_head_variant<4, 2>(), warp_per_head_variant<4, 3>(), warp_per_head_variant<4, 4>(),
    warp_per_head_variant<8, 2>(), warp_per_head_variant<8, 3>(),
    // With the diagnostic timeline: what the heuristic picks for the short
    // rows of the benchmark, and the b1 L1k cluster.
    variant<8, 2, 0, true>(), variant<9, 2, 0, true>(), variant<10, 2, 0, true>(),
    variant<4, 3, 0, true>(), variant<4, 2, 0, true>(),
    variant<4, 2, 4, true>(), variant<4, 2, 8, true>(),
    warp_per_head_variant<4, 2, true>(), warp_per_head_variant<4, 3, true>(),
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

const Variant* find_variant(const LaunchConfig& cfg, bool timeline) {
  const bool warp_per_head = cfg.num_splits == 0;
  for (const Variant& v : kVariants) {
    if (v.warps == cfg.num_warps && v.stages == cfg.num_stages &&
        v.warp_per_head == warp_per_head && v.timeline == timeline &&
        v.cluster_splits == (cfg.cluster ? cfg.num_splits : 0))
      return &v;
  }
  return nullptr;
}

// Devices whose per-kernel setup is cached (beyond: redone at every launch).
constexpr int kMaxDevices = 64;

// Dynamic shared memory above 48 KB and clusters above the portable 8 CTAs
// must be opted into, once per kernel and device.
cudaError_t prepare_kernel(const Variant& v, int device) {
  static std::atomic<bool> done[kNumVariants][kMaxDevices] = {};
  const int idx = static_cast<int>(&v - kVariants);
  if (device < kMaxDevices && done[idx][device].load(std::memory_order_relaxed)) return cudaSuccess;
  int max_optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_optin);
  if (err == cudaSuccess && v.cluster_splits > 8)
    err = cudaFuncSetAttribute(v.kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err == cudaSuccess && device < kMaxDevices) done[idx][device] = true;
  return err;
}

// Dynamic shared memory of a launch. Non-sliding launches pad it so that at
// most 8 / warps CTAs share an SM: with PDL the next grid's CTAs launch while
// this one drains and would otherwise pile onto the first SMs to free up.
int launch_smem_bytes(const Variant& v, bool sliding) {
  if (sliding) return v.smem_bytes;
  const int ctas_per_sm = std::max(1, 8 / v.warps);
  return std::max(v.smem_bytes, kSmemPerSm / (ctas_per_sm + 1) + 1);
}

// CTAs of `v` the GPU holds at once (the persistent warp-per-head grid's size,
// the split kernel's limit on active splits); asked once per kernel, device
// and padding, not at every launch.
cudaError_t resident_ctas(const Variant& v, int device, bool sliding, int* ctas) {
  static std::atomic<int> cache[kNumVariants][kMaxDevices][2] = {};
  const int idx = static_cast<int>(&v - kVariants);
  if (device < kMaxDevices) {
    *ctas = cache[idx][device][sliding].load(std::memory_order_relaxed);
    if (*ctas > 0) return cudaSuccess;
  }
  int sms = 0, fit = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, v.kernel, 32 * v.warps,
                                                        launch_smem_bytes(v, sliding));
  if (err != cudaSuccess) return err;
  *ctas = std::max(sms * std::max(fit, 1), 1);
  if (device < kMaxDevices) cache[idx][device][sliding].store(*ctas, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace

std::string check_launch_config(const LaunchConfig& cfg, bool timeline) {
  if (cfg.cluster && cfg.num_splits <= 0)
    return "a cluster merge needs num_splits > 0 (the cluster's size), got " +
           std::to_string(cfg.num_splits);
  const Variant* v = find_variant(cfg, timeline);
  if (v == nullptr) {
    std::string have;
    for (const Variant& k : kVariants)
      if (k.timeline == timeline)
        have += " (warps " + std::to_string(k.warps) + ", stages " + std::to_string(k.stages) +
                (k.cluster_splits ? ", cluster of " + std::to_string(k.cluster_splits) : "") +
                (k.warp_per_head ? ", warp per head (splits 0)" : "") + ")";
    return "no compiled kernel for " + std::to_string(cfg.num_warps) + " warps, " +
           std::to_string(cfg.num_stages) + " stages" +
           (cfg.cluster ? ", cluster of " + std::to_string(cfg.num_splits) : "") +
           (cfg.num_splits == 0 ? ", warp per head" : "") + "; compiled:" + have;
  }
  if (cfg.num_splits < 0 || cfg.min_pages < 1)
    return "num_splits must be >= 0 (0: one warp per (request, kv head)) and min_pages >= 1, "
           "got " + std::to_string(cfg.num_splits) + " and " + std::to_string(cfg.min_pages);
  return {};
}

int64_t num_ctas(const DecodeParams& params, const LaunchConfig& cfg) {
  const int64_t num_pairs = int64_t(params.batch) * params.num_kv_heads;
  return cfg.num_splits == 0 ? (num_pairs + cfg.num_warps - 1) / cfg.num_warps
                             : num_pairs * cfg.num_splits;
}

cudaError_t launch_decode_attention(const DecodeParams& params, const LaunchConfig& cfg,
                                    bool sliding, bool pdl, cudaStream_t stream) {
  // Callers check_launch_config first.
  const Variant& v = *find_variant(cfg, params.timeline != nullptr);
  DecodeParams p = params;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = prepare_kernel(v, device);
  if (err != cudaSuccess) return err;

  cudaLaunchConfig_t launch = {};
  const int num_pairs = params.batch * params.num_kv_heads;
  // Every launch but a cluster's is sized by the CTAs the GPU holds at once.
  int ctas = 0;
  if (!cfg.cluster) err = resident_ctas(v, device, sliding, &ctas);
  if (err != cudaSuccess) return err;
  if (v.warp_per_head) {
    // Persistent: as many warps as the GPU holds at once, or fewer with the
    // same largest number of pairs per warp; each warp loops over its pairs
    // with one ring instead of the grid running in waves whose CTAs each pay
    // the whole prologue (swa128 b256: 37.1 against 37.7 us, device run 10;
    // 35.5 once the ring goes on across pairs, run 12).
    const int warp_slots = ctas * cfg.num_warps;
    const int pairs_per_warp = ceil_div(num_pairs, warp_slots);
    launch.gridDim = dim3(ceil_div(num_pairs, cfg.num_warps * pairs_per_warp));
    // Refill after the wait where every warp has two pairs or more to stream
    // (swa128 b256: 35.1 -> 34.7 us; b64, one pair per warp: 10.7 -> 11.0,
    // device run 31).
    if (p.refill_after_wait < 0) p.refill_after_wait = pairs_per_warp >= 2;
  } else {
    launch.gridDim = dim3(cfg.num_splits, params.num_kv_heads, params.batch);
    // At most one wave of active splits: the splits past it stay idle (the
    // batch 1-2 heuristic launches twice as many) instead of running a
    // second wave (b1 L32k: 34.4 against 40.2 us with all 32 splits of 8
    // warps active, device run 16). A cluster keeps every rank active.
    if (!cfg.cluster) p.max_active_splits = std::max(1, ctas / num_pairs);
    // Refill after the wait in the 8-warp splits (batch <= 4 or <= 8 pairs):
    // their 1024 streaming warps keep ~8 MB in flight with one page each,
    // about twice what the HBM ceiling needs, and the shorter queue gains on
    // every such row (b1 L128k 124.2 -> 122.7, b4 L8k 34.1 -> 33.7, b1 L8k
    // 11.7 -> 11.6 us); the 4-warp splits (b64 L8k 475.9 -> 476.9) and the
    // clusters (b1 L1k 3.75 -> 3.85) lose (device run 31). In the 9- and
    // 10-warp splits (<= 8 pairs) the warps whose first page is still in flight at
    // the release refill before the wait, to catch up (b1 L8k / h1 b8 11.5
    // -> 11.4 us, period mean 11.74 -> 11.49; device run 57).
    if (p.refill_after_wait < 0)
      p.refill_after_wait = cfg.cluster || cfg.num_warps < 8 ? 0 : cfg.num_warps == 8 ? 1 : 2;
  }
  launch.blockDim = dim3(32 * cfg.num_warps);
  launch.dynamicSmemBytes = launch_smem_bytes(v, sliding);
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
  return cudaLaunchKernelEx(&launch, v.kernel, p);
}

}  // namespace flint
