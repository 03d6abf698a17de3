// Test-only op flint_testing::split_phases: the 9-warp split kernel (the
// plan of calls with at most 8 (request, kv head) pairs, kernel_split.cuh) built
// with a probe that stamps %globaltimer (ns) as lane 0 of each warp passes each
// SplitPhase, into stamps[cta][warp][phase] (0: not reached; CTAs in grid
// order, x fastest). Launched as the op launches that plan (workspace, grid,
// shared memory, PDL), so a CUDA graph of back-to-back calls shows where a
// short call's time goes (tools/phases_row.py --kernel split).
// Registered in ops.cpp.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "decode_attention/kernel_split.cuh"
#include "decode_attention/launch_plan.h"
#include "ops/params_from_tensors.h"
#include "ops/validation.h"
#include "ptx/timer.cuh"
#include "testing/probe_launch.h"

namespace flint {
namespace {

constexpr int kProbedWarps = 9;

struct SplitStampProbe {
  uint64_t* stamps;  // [grid CTAs][kProbedWarps][kNumSplitPhases]

  __device__ __forceinline__ void at(SplitPhase phase) {
    const uint64_t now = ptx::global_timer_ns();
    if (threadIdx.x % 32 != 0) return;
    const int64_t cta = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
    stamps[(cta * kProbedWarps + threadIdx.x / 32) * kNumSplitPhases + phase] = now;
  }
  __device__ __forceinline__ void leading_issued() { at(kSplitLeadingIssued); }
  __device__ __forceinline__ void waited() { at(kSplitWaited); }
};

template <class Kv, int kStages>
__global__ void __launch_bounds__(32 * kProbedWarps, 1)
    split_phases_kernel(const __grid_constant__ DecodeParams p, uint64_t* stamps) {
  SplitStampProbe probe{stamps};
  split_attention<Kv, kProbedWarps, kStages, 0>(p, probe);
}

}  // namespace

// The op's arguments, `plan` (a split plan of 9 warps: the split kernels'
// plan of the call, flint_testing.split_rules_plan) and `stamps`: int64
// [splits x kv heads x batch, 9, kNumSplitPhases] on q's device.
void split_phases(const at::Tensor& q, const at::Tensor& kv_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                  const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                  const at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                  const std::optional<at::Tensor>& v_scale, const at::Tensor& stamps,
                  const LaunchPlan& plan) {
  const std::optional<at::Tensor> given_sinks = sinks, no_lse;
  const DecodeArgs args{q,   kv_cache, block_tables, seq_lens, given_sinks, window,
                        scale, out,    k_scale,      v_scale,  no_lse};
  check_decode_attention_args(args);
  const KvDtype kv = kv_cache.scalar_type() == at::kFloat8_e4m3fn ? KvDtype::kFp8E4m3 : KvDtype::kBf16;
  TORCH_CHECK(plan.kind == KernelKind::kSplit && plan.warps == kProbedWarps && plan.kv == kv &&
                  plan.stages == (kv == KvDtype::kBf16 ? 2 : 4) && check_plan(plan).empty(),
              "split_phases: the 9-warp split plan of the cache's format (2 bf16 / 4 fp8 slots)");
  const c10::cuda::CUDAGuard guard(q.device());
  DecodeParams p = params_from_tensors(args);
  if (p.num_blocks == 0) p.max_blocks = 0;
  C10_CUDA_CHECK(encode_kv_map(p));
  LaunchShape shape{};
  C10_CUDA_CHECK(launch_shape(p, plan, q.device().index(), &shape));
  // As launch_decode_attention sets them for a split plan.
  p.refill = plan.refill;
  p.min_pages = plan.min_pages;
  p.max_active_splits = shape.max_active_splits;
  const int64_t ctas = int64_t(shape.grid.x) * shape.grid.y * shape.grid.z;
  TORCH_CHECK(stamps.scalar_type() == at::kLong && stamps.is_contiguous() &&
                  stamps.device() == q.device() &&
                  stamps.numel() == ctas * kProbedWarps * kNumSplitPhases,
              "split_phases: stamps must be contiguous int64 [", ctas, ", ", kProbedWarps, ", ",
              static_cast<int>(kNumSplitPhases), "] on ", q.device());
  const void* fn = kv == KvDtype::kBf16
                       ? reinterpret_cast<const void*>(&split_phases_kernel<detail::KvBf16, 2>)
                       : reinterpret_cast<const void*>(&split_phases_kernel<detail::KvFp8, 4>);
  launch_probe(fn, p, shape, plan.pdl, stamps, "split_phases");
}

}  // namespace flint
