// Paged decode attention with one warp per (request, kv head): no splits and no
// merge. A persistent grid of at most ceil(batch x kv heads / kWarps) CTAs (what
// the GPU holds at once, see launch.cu); warp w of CTA c takes the pair c x kWarps + w
// (and every gridDim.x x kWarps-th after it), streams all its attended pages
// through its own ring and writes the normalized output straight from its
// fragments.
//
// Meant for short attended spans at large batch (sliding-window layers), where
// the split kernel's CTAs spend more time on serial latencies (seq_len -> block
// table -> page -> merge) than on bytes: here one CTA carries kWarps pairs and
// no CTA-wide barrier, so a warp's latencies hide behind the other warps'.
// Selected with num_splits = 0 in the launch configuration.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/params.h"
#include "decode_attention/smem_plan.h"
#include "decode_attention/timeline.cuh"
#include "decode_attention/warp_pages.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"

namespace flint {

namespace detail {

// Lane (g, t) holds O^T for heads 2t, 2t+1 at dims d0, d0 + 1 of m-tile j
// (d0 = 64(j / 4) + 8g + 2(j % 4)): one bf16 pair per (j, head).
__device__ __forceinline__ void store_warp_out(uint16_t* out_kv_head, int64_t stride_h,
                                               const float (&o)[32], float inv0, float inv1,
                                               int g, int t) {
  uint16_t* head0 = out_kv_head + (2 * t) * stride_h;
  uint16_t* head1 = head0 + stride_h;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int d0 = 64 * (j / 4) + 8 * g + 2 * (j % 4);
    *reinterpret_cast<uint32_t*>(head0 + d0) = ptx::pack_bf16x2(o[4 * j] * inv0, o[4 * j + 2] * inv0);
    *reinterpret_cast<uint32_t*>(head1 + d0) =
        ptx::pack_bf16x2(o[4 * j + 1] * inv1, o[4 * j + 3] * inv1);
  }
}

}  // namespace detail

template <int kWarps, int kStages, bool kTimeline = false>
__global__ void __launch_bounds__(32 * kWarps)
    decode_attention_warp_per_head_kernel(const __grid_constant__ DecodeParams p) {
  using Plan = SmemPlan<kWarps, kStages, 0>;  // the ring and barriers; no merge buffers
  using namespace detail;

  extern __shared__ __align__(128) uint8_t smem[];
  stamp<kTimeline>(p, kStampEntry);  // thread 0: the stamps follow warp 0's pairs
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int num_pairs = p.batch * p.num_kv_heads;
  // NOTE: a warp without a pair leaves at once; nothing below is CTA-wide.
  if (blockIdx.x * kWarps + warp >= num_pairs) return;
  const uint32_t ring = ptx::smem_addr(smem) + warp * kStages * kPageBytes;
  const uint32_t bars = ptx::smem_addr(smem + Plan::kBarOffset) + warp * kStages * 8;
  init_ring_barriers<kStages>(bars, lane);

  // Warp w of CTA c takes pairs c x kWarps + w + i x gridDim.x x kWarps: one
  // pair unless the launch made the grid persistent (fewer CTAs than pairs
  // need, launch.cu); its ring goes on from pair to pair (ring_base).
  // Each pair's seq_len is loaded one pair ahead, so that a persistent warp's
  // next extent arrives while it streams (the block table still follows it).
  const int stride = gridDim.x * kWarps;
  int ring_base = 0;
  int next_len = p.seq_lens[(blockIdx.x * kWarps + warp) / p.num_kv_heads];
  for (int pair = blockIdx.x * kWarps + warp; pair < num_pairs; pair += stride) {
    const int b = pair / p.num_kv_heads, kvh = pair % p.num_kv_heads;
    const int raw_len = next_len;
    if (pair + stride < num_pairs) next_len = p.seq_lens[(pair + stride) / p.num_kv_heads];
    uint16_t* out_kv_head = p.out + b * p.out_stride_b + (kvh * kGqa) * p.out_stride_h;
    // Sinks are weights, never written by the previous kernel: read them first.
    const float sink0 = p.sinks[kvh * kGqa + 2 * t] * kLog2eF;
    const float sink1 = p.sinks[kvh * kGqa + 2 * t + 1] * kLog2eF;

    // ---- sequence extent (read before griddepcontrol.wait, see kernel.cuh) --
    const int seq_len = min(max(raw_len, 0), p.max_blocks * kPageTokens);
    const int start_tok = p.window > 0 ? max(seq_len - p.window, 0) : 0;
    const int start_page = start_tok / kPageTokens;
    const int n_pages = (seq_len + kPageTokens - 1) / kPageTokens - start_page;

    if (n_pages <= 0) {
      ptx::grid_dependency_wait();  // the previous kernel may still read `out`
      const float zeros[32] = {};
      store_warp_out(out_kv_head, p.out_stride_h, zeros, 0.f, 0.f, g, t);
      continue;
    }

    // ---- this warp's pages: start_page + k, k < n_pages --------------------
    const WarpPages pages{p.block_tables + b * p.bt_stride_b + start_page,
                          p.kv_cache + kvh * p.kv_stride_head,
                          p.kv_stride_block,
                          p.num_blocks,
                          start_page,
                          1,
                          n_pages,
                          ring,
                          bars,
                          ring_base};
    const int bt_cur = pages.block_at(lane), bt_next = pages.block_at(lane + 32);
    // NOTE: refilling the previous pair's slots needs no extra __syncwarp: the
    // leading pages go to slots that pair consumed before its last page (the
    // __syncwarp that began its last iteration ordered those reads), and the
    // slot of its last page is refilled after the __syncwarp of this pair's
    // first iteration.

    // ---- prefetch, wait on the previous kernel, stream pages -----------------
    // (after the first pair, griddepcontrol.wait returns at once.)
    WarpState st;
    wait_then_stream_pages<kStages, kTimeline>(p, pages, bt_cur, bt_next, b, kvh, start_tok,
                                               seq_len, g, t, lane, st);

    // ---- normalize with the sink term and store ------------------------------
    const float inv0 = 1.f / (st.l[0] + ptx::ex2(sink0 - st.m[0] * p.scale_log2));
    const float inv1 = 1.f / (st.l[1] + ptx::ex2(sink1 - st.m[1] * p.scale_log2));
    store_warp_out(out_kv_head, p.out_stride_h, st.o, inv0, inv1, g, t);
    ring_base += n_pages;
  }
  stamp<kTimeline>(p, kStampExit);
}

}  // namespace flint
