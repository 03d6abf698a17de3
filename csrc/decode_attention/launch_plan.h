// How decode_attention is launched, in one place: which compiled kernel, its
// grid, block and shared memory, and every per-launch parameter. No torch
// headers.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "decode_attention/params.h"

namespace flint {

enum class KernelKind : int {
  kBalanced = 0,     // kernel_balanced.cuh: the pages divided on the device
  kSplit = 1,        // kernel_split.cuh: a fixed number of CTAs per (request, kv head)
  kCluster = 2,      // kernel_split.cuh: those CTAs merged in a thread-block cluster
  kWarpPerHead = 3,  // kernel_warp_per_head.cuh: one warp per (request, kv head)
};

// The compile-time variant and the launch-time choices of one launch.
struct LaunchPlan {
  KernelKind kind = KernelKind::kBalanced;
  KvDtype kv = KvDtype::kBf16;
  int warps = 8, stages = 2;
  // Split kernels: CTAs per (request, kv head) on average (the grid's x; the
  // kernel divides a kv head's splits x batch CTAs among its requests by
  // their lengths; the cluster's size with kCluster) and the pages each warp
  // of an active split gets at least.
  int splits = 0, min_pages = 1;
  Refill refill = Refill::kBeforeWait;
  bool pdl = true;  // programmatic dependent launch
  int ctas = 0;     // balanced kernel: the grid's CTAs (0: the launch's rule; A/B runs)
};

// The plan for a call, from what a captured CUDA graph keeps fixed: the batch
// size, the row tiles a request brings (kv heads x row tiles: DecodeParams::tiles),
// the window (0: none), the cache's dtype and the SM count (never the lengths
// nor the block tables' width).
LaunchPlan plan_launch(int batch, int tiles, int window, KvDtype kv, int num_sms);

// Whether a window (0: none) is short enough for the short-span kernels
// (cluster, one split, warp per head) at this batch size and tiles; longer
// windows are planned by the split kernels' full-attention rules.
bool short_window(int window, int batch, int tiles, int num_sms);

// The split kernels' plan for such a call (what plan_launch picks for
// sliding windows and for full attention below 8 requests or over as few
// (request, tile) pairs as their grid gives 8 CTAs each), for A/B runs
// against the balanced kernel on any shape.
LaunchPlan split_kernels_plan(int batch, int tiles, bool short_window, KvDtype kv,
                              int num_sms);

// Empty if `plan` names a compiled kernel and valid parameters, else why not
// (with the list of compiled variants).
std::string check_plan(const LaunchPlan& plan);

// What a launch of `plan` for the call `p` looks like on `device`.
struct LaunchShape {
  dim3 grid, block;
  int smem_bytes;
  int64_t partials;  // workspace partials (rows of part_o / part_ml) it may use
  int64_t counters;  // workspace arrival counters it may use
  // Split kernels: at most this many of a (request, kv head)'s CTAs take
  // pages, so that the active ones make one wave (a cluster keeps every rank).
  int max_active_splits;
};
cudaError_t launch_shape(const DecodeParams& p, const LaunchPlan& plan, int device,
                         LaunchShape* shape);

// For an fp8 cache, writes p.kv_map, the tensor map its kernels copy pages
// through (launch_decode_attention does; a launcher of its own must too).
cudaError_t encode_kv_map(DecodeParams& p);

// Launches `plan` (check_plan first) on `stream`, the workspace in p.
cudaError_t launch_decode_attention(const DecodeParams& p, const LaunchPlan& plan,
                                    cudaStream_t stream);

// The compiled variants, for tests and tuning: plan i of num_variants().
int num_variants();
LaunchPlan variant_plan(int i);

}  // namespace flint
