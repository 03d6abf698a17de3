// Test-only op flint_testing::balanced_phases: the balanced kernel built with a
// probe that stamps %globaltimer (ns) as lane 0 of each warp passes each
// BalancedPhase (decode_attention/probes.cuh), into stamps[cta][warp][phase]
// (0: not reached), and sums the warp's stream cycles by StreamSection
// (decode_attention/probes.cuh). Launched as the op launches it (workspace, grid, PDL), so a
// CUDA graph of back-to-back calls shows where a call's time goes
// (tools/phases_row.py). Registered in ops.cpp.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "decode_attention/kernel_balanced.cuh"
#include "decode_attention/launch_plan.h"
#include "ops/params_from_tensors.h"
#include "ops/validation.h"
#include "ptx/timer.cuh"
#include "testing/probe_launch.h"

namespace flint {
namespace {

// stamps[cta][warp]: kNumBalancedPhases %globaltimer stamps, then the warp's
// cycles (%clock64) in each StreamSection between kWaited and kStreamed, then
// its number of pieces (its kFirstWait laps).
constexpr int kStampsPerWarp = kNumBalancedPhases + detail::kNumStreamSections + 1;

struct StampProbe {
  uint64_t* stamps;  // [grid][warps][kStampsPerWarp]
  uint64_t last = 0;
  uint64_t cycles[detail::kNumStreamSections] = {};
  int pieces = 0;

  __device__ __forceinline__ uint64_t* mine() const {
    return stamps + (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * kStampsPerWarp;
  }
  __device__ __forceinline__ void at(BalancedPhase phase) {
    const uint64_t now = ptx::global_timer_ns();
    if (phase == kWaited) {  // the sections count from here (the leading issues' laps dropped)
      last = ptx::clock_cycles();
#pragma unroll
      for (int i = 0; i < detail::kNumStreamSections; ++i) cycles[i] = 0;
      pieces = 0;
    }
    if (threadIdx.x % 32 != 0) return;
    uint64_t* s = mine();
    s[phase] = now;
    if (phase == kStreamed) {
#pragma unroll
      for (int i = 0; i < detail::kNumStreamSections; ++i) s[kNumBalancedPhases + i] = cycles[i];
      s[kNumBalancedPhases + detail::kNumStreamSections] = pieces;
    }
  }
  // Unrolled over the sections so that `cycles` stays in registers.
  __device__ __forceinline__ void lap(detail::StreamSection section) {
    const uint64_t now = ptx::clock_cycles();
#pragma unroll
    for (int i = 0; i < detail::kNumStreamSections; ++i)
      if (i == section) cycles[i] += now - last;
    pieces += section == detail::kFirstWait;
    last = now;
  }
};

template <class Kv, int kWarps, int kStages>
__global__ void __launch_bounds__(32 * kWarps, 1)
    balanced_phases_kernel(const __grid_constant__ DecodeParams p, uint64_t* stamps) {
  StampProbe probe{stamps};
  balanced_attention<Kv, kWarps, kStages>(p, probe);
}

}  // namespace

// The op's arguments, then `stamps`: int64 [ctas, warps, kStampsPerWarp]
// on q's device, ctas the grid the balanced plan launches (flint_testing.division).
void balanced_phases(const at::Tensor& q, const at::Tensor& kv_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                     const at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                     const std::optional<at::Tensor>& v_scale, const at::Tensor& stamps) {
  const std::optional<at::Tensor> given_sinks = sinks, no_lse;
  const DecodeArgs args{q,   kv_cache, block_tables, seq_lens, given_sinks, window,
                        scale, out,    k_scale,      v_scale,  no_lse};
  check_decode_attention_args(args);
  const c10::cuda::CUDAGuard guard(q.device());
  // The op's balanced plan: 8 warps, 2 (bf16) or 4 (fp8) stages.
  const bool fp8 = kv_cache.scalar_type() == at::kFloat8_e4m3fn;
  const LaunchPlan plan{.kind = KernelKind::kBalanced,
                        .kv = fp8 ? KvDtype::kFp8E4m3 : KvDtype::kBf16,
                        .warps = 8,
                        .stages = fp8 ? 4 : 2,
                        .refill = Refill::kKernelRule};
  DecodeParams p = params_from_tensors(args);
  if (p.num_blocks == 0) p.max_blocks = 0;
  p.refill = plan.refill;
  C10_CUDA_CHECK(encode_kv_map(p));
  LaunchShape shape{};
  C10_CUDA_CHECK(launch_shape(p, plan, q.device().index(), &shape));
  TORCH_CHECK(stamps.scalar_type() == at::kLong && stamps.is_contiguous() &&
                  stamps.device() == q.device() &&
                  stamps.numel() == int64_t(shape.grid.x) * plan.warps * kStampsPerWarp,
              "balanced_phases: stamps must be contiguous int64 [", shape.grid.x, ", ", plan.warps,
              ", ", kStampsPerWarp, "] on ", q.device());
  const void* fn = plan.kv == KvDtype::kBf16
                       ? reinterpret_cast<const void*>(&balanced_phases_kernel<detail::KvBf16, 8, 2>)
                       : reinterpret_cast<const void*>(&balanced_phases_kernel<detail::KvFp8, 8, 4>);
  launch_probe(fn, p, shape, true, stamps, "balanced_phases");
}

}  // namespace flint
