// Split-KV paged decode attention for Hopper (sm_90a).
//
// Grid (splits, kv heads, batch); 32 x kWarps threads per CTA. The attended
// pages of one (request, kv head) are interleaved over all warps of its active
// splits. Each warp streams whole 8 KB pages (16 tokens x [K | V]) through a
// private ring of kStages shared-memory slots filled by bulk copies, and runs
// S^T = K Q^T and O^T += V^T P^T on the tensor cores with the 8 query heads of
// the GQA group as the n = 8 dimension. The warps of a CTA merge through
// shared memory; several splits merge either in the last warp to arrive for
// each head (fp32 partials in a global workspace) or, with kClusterSplits > 0,
// through the distributed shared memory of a thread-block cluster.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/kernels/registry.h"
#include "decode_attention/merge.cuh"
#include "decode_attention/params.h"
#include "decode_attention/smem_plan.h"
#include "decode_attention/warp_pages.cuh"
#include "ptx/bulk_copy.cuh"
#include "ptx/cluster.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"
#include "ptx/mma.cuh"

namespace flint {

namespace detail {

// Column of dim d of head h in a warp's merge buffer. Lane (g, t) writes
// heads 2t, 2t+1 at dims 8g + 2w (+64): unswizzled, the four t of one g hit
// the same banks (rows are 128 floats apart), a 4-way conflict on every
// store. XOR with (h & 6) = 2t spreads them over the 32 banks; it keeps
// float2 pairs and, within a float4, at most swaps its halves (see
// read_warp_o).
__device__ __forceinline__ int warp_buf_col(int h, int d) { return d ^ (h & 6); }

// Writes a warp's (O, m, l) to its merge buffer: O as [head][dim] fp32 (dims
// swizzled, warp_buf_col), then m[8], l[8]. Fragment o[4j + e] is head
// 2t + (e & 1), dim o_tile_dim(j, g) + (e >> 1).
template <class Plan>
__device__ __forceinline__ void store_warp_state(float* buf, const WarpState& st, int g, int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int d0 = KvBf16::o_tile_dim(j, g);
    ptx::st_shared_f32x2(ptx::smem_addr(&buf[(2 * t) * kHeadDim + warp_buf_col(2 * t, d0)]),
                         st.o[4 * j], st.o[4 * j + 2]);
    ptx::st_shared_f32x2(ptx::smem_addr(&buf[(2 * t + 1) * kHeadDim + warp_buf_col(2 * t + 1, d0)]),
                         st.o[4 * j + 1], st.o[4 * j + 3]);
  }
  if (g == 0) {
    buf[Plan::kWarpM + 2 * t] = st.m[0];
    buf[Plan::kWarpM + 2 * t + 1] = st.m[1];
    buf[Plan::kWarpL + 2 * t] = st.l[0];
    buf[Plan::kWarpL + 2 * t + 1] = st.l[1];
  }
}

// Dims d .. d+3 (d % 4 == 0) of head h from a warp's merge buffer: one float4
// at the swizzled column, halves swapped back when (h & 2).
__device__ __forceinline__ float4 read_warp_o(const float* buf, int h, int d) {
  const float4 x = *reinterpret_cast<const float4*>(&buf[h * kHeadDim + (d ^ (h & 4))]);
  return (h & 2) ? make_float4(x.z, x.w, x.x, x.y) : x;
}

// The fewest splits of `warps` warps that give each warp the same largest
// number of the `pages`, at most `cap` and each warp at least min_pages.
__device__ __forceinline__ int fewest_splits(int pages, int warps, int cap, int min_pages) {
  const int splits = min(cap, (pages + warps * min_pages - 1) / (warps * min_pages));
  const int pages_per_warp = (pages + splits * warps - 1) / (splits * warps);
  return (pages + pages_per_warp * warps - 1) / (pages_per_warp * warps);
}

}  // namespace detail

template <int kWarps, int kStages, int kClusterSplits>
__global__ void __launch_bounds__(32 * kWarps, 1)
    decode_attention_kernel(const __grid_constant__ DecodeParams p) {
  using Plan = SmemPlan<kWarps, kStages, kClusterSplits>;
  using namespace detail;
  // Epilogue mapping: thread tid < 32 kMergeWarps owns E consecutive dims
  // [ed, ed + E) of head eh.
  constexpr int kMergeWarps = Plan::kMergeWarps;
  constexpr int E = kGqa * kHeadDim / (32 * kMergeWarps);
  constexpr int kThreadsPerHead = kHeadDim / E;

  extern __shared__ __align__(128) uint8_t smem[];
  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int max_splits = gridDim.x;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const bool merges = warp < kMergeWarps;
  const int eh = merges ? tid / kThreadsPerHead : 0, ed = (tid % kThreadsPerHead) * E;
  const int bh = b * p.num_kv_heads + kvh;
  uint16_t* out_row = p.out + b * p.out_stride_b + (kvh * kGqa + eh) * p.out_stride_h;
  // NOTE: sinks are weights, never written by the kernel this one overlaps
  // with: read them first so that the epilogue never waits on a global load.
  const float sink_scaled = p.sinks[kvh * kGqa + eh] * kLog2eF;
  const float cluster_sink_scaled =
      kClusterSplits > 0
          ? p.sinks[kvh * kGqa + cluster_merge_head<kWarps, kClusterSplits>(tid)] * kLog2eF
          : 0.f;

  // ---- sequence extent ---------------------------------------------------
  // NOTE: seq_lens and block tables are read before griddepcontrol.wait: they
  // are written by host-to-device copies ahead of the forward, never by the
  // kernel this one overlaps with.
  const auto [seq_len, start_tok, start_page, num_pages] = seq_extent(p, p.seq_lens[b]);
  // A split is active when each of its warps gets at least min_pages pages and
  // the active CTAs fit the GPU at once (max_active_splits), and of those only
  // as many as give each warp the same largest number of pages: the SMs left
  // over let the next call's CTAs in before this call ends. Warps past the
  // kMergeWarps stream only where they lower that number of splits (b1 L8k:
  // 15 of 9 warps instead of 16 of 8); elsewhere they would only add pages in
  // flight. A cluster keeps every rank active (each one merges a slice of the
  // dims).
  int num_splits = max_splits, stream_warps = kWarps;
  if constexpr (kClusterSplits == 0) {
    const int pages = max(num_pages, 1), cap = min(max_splits, p.max_active_splits);
    num_splits = fewest_splits(pages, kWarps, cap, p.min_pages);
    if constexpr (kWarps > kMergeWarps) {
      const int merge_warp_splits = fewest_splits(pages, kMergeWarps, cap, p.min_pages);
      if (merge_warp_splits <= num_splits) {
        num_splits = merge_warp_splits;
        stream_warps = kMergeWarps;
      }
    }
  }

  if (num_pages <= 0) {
    // ---- empty sequence: zeros ----------------------------------------------
    ptx::grid_dependency_wait();  // the previous kernel may still read `out`
    if (split == 0 && merges) {
      float zeros[E] = {};
      store_out<E>(out_row + ed, zeros, 0.f);
    }
    return;
  }
  if (split >= num_splits) return;

  // ---- this warp's pages --------------------------------------------------
  // Warp gw of the (request, kv head) takes pages start_page + gw + k * warps_total.
  const int warps_total = num_splits * stream_warps;
  const int gw = split * stream_warps + warp;
  const int n_pages =
      warp < stream_warps ? (max(num_pages - gw, 0) + warps_total - 1) / warps_total : 0;
  const WarpPages pages{p.block_tables + b * p.bt_stride_b + start_page + gw,
                        static_cast<const uint16_t*>(p.kv_cache) + kvh * p.kv_stride_head,
                        p.kv_stride_block,
                        p.num_blocks,
                        start_page + gw,
                        warps_total,
                        n_pages,
                        ptx::smem_addr(smem) + warp * kStages * kPageBytes,
                        ptx::smem_addr(smem + Plan::kBarOffset) + warp * kStages * 8};
  const int bt_cur = pages.block_at(lane), bt_next = pages.block_at(lane + 32);
  init_ring_barriers<kStages>(pages.bars, lane);
  if constexpr (kClusterSplits > 0) {
    // Peers must be running before anyone stores into their shared memory;
    // waited on in cluster_merge, long after the pages are streamed.
    ptx::cluster_arrive_relaxed();
  }

  // ---- prefetch, wait on the previous kernel, stream pages -------------------
  WarpState st;
  wait_then_stream_pages<kStages>(p, pages, bt_cur, bt_next, b, kvh, start_tok, seq_len,
                                             g, t, lane, st);

  // ---- merge the warps of this CTA (through the ring's shared memory) -------
  __syncthreads();  // every warp is done with its ring
  float* warp_bufs = reinterpret_cast<float*>(smem);
  store_warp_state<Plan>(warp_bufs + warp * Plan::kWarpBufFloats, st, g, t);
  __syncthreads();
  if (!merges) return;

  float m_cta = neg_inf();
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
    m_cta = fmaxf(m_cta, warp_bufs[w * Plan::kWarpBufFloats + Plan::kWarpM + eh]);
  const float m_cta_scaled = m_cta * p.scale_log2, shift = softmax_shift(m_cta_scaled);
  float l_cta = 0.f;
  float o[E] = {};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float* buf = warp_bufs + w * Plan::kWarpBufFloats;
    const float corr = rescale(buf[Plan::kWarpM + eh], p.scale_log2, shift);
    l_cta += corr * buf[Plan::kWarpL + eh];
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      const float4 x = read_warp_o(buf, eh, ed + e);
      o[e] += corr * x.x;
      o[e + 1] += corr * x.y;
      o[e + 2] += corr * x.z;
      o[e + 3] += corr * x.w;
    }
  }
  if constexpr (kClusterSplits > 0) {
    // ---- merge the splits of the cluster ------------------------------------
    cluster_merge<kWarps, kClusterSplits>(p, smem + Plan::kClusterOffset, split, b, kvh, tid, eh,
                                          ed, o, m_cta, l_cta, cluster_sink_scaled);
  } else if (num_splits == 1) {
    store_out<E>(out_row + ed, o, 1.f / (l_cta + ptx::ex2(sink_scaled - m_cta_scaled)));
  } else {
    // ---- merge the splits: partials to the workspace -------------------------
    store_global_partial<E>(p, int64_t(bh) * max_splits + split, o, m_cta, l_cta, eh, ed);
    // ---- each warp: arrive for its heads, merge them if last -----------------
    // NOTE: bar.warp.sync orders the lanes' partial stores before lane 0's
    // release, and lane 0's acquire before the lanes' loads of the other
    // splits' partials (ld.global.cg, never from L1). Per warp, not per CTA:
    // no bar.sync on the way, and the merges of a pair's heads run in
    // parallel (b1 L8k: final merge 1.38 -> 0.96 us, device run 26).
    __syncwarp();
    int* counter = p.counters + int64_t(bh) * kMergeWarps + warp;
    int arrival = 0;
    if (lane == 0) arrival = ptx::atomic_add_acq_rel_gpu(counter, 1);
    arrival = __shfl_sync(kFullMask, arrival, 0);
    __syncwarp();
    if (arrival == num_splits - 1) {
      merge_splits<kMergeWarps>(p, bh, num_splits, eh, ed, sink_scaled, out_row);
      // The counter resets itself for the next launch on this stream.
      if (lane == 0) ptx::st_relaxed_gpu(counter, 0);
    }
  }
}

template <int kWarps, int kStages, int kClusterSplits>
KernelEntry split_entry() {
  return {reinterpret_cast<const void*>(&decode_attention_kernel<kWarps, kStages, kClusterSplits>),
          SmemPlan<kWarps, kStages, kClusterSplits>::kBytes};
}

}  // namespace flint
