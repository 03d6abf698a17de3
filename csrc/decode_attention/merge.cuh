// Merging the parts of one (request, kv head) that different CTAs computed:
// from fp32 partials in the workspace (the split and balanced kernels: the
// last to arrive merges), or inside a thread-block cluster through
// distributed shared memory. Both finish softmax with the sink term:
//   out = v sum_s w_s O_s / (sum_s w_s l_s + 2^(sink log2(e) - M c)),
//   w_s = 2^(m_s c - M c), M = max_s m_s, c = the logits' scale x log2(e)
//   (x k_scale x 2^e for fp8, kv_format.cuh's HeadScales), v = v_scale (1 for bf16).
#pragma once

#include "decode_attention/params.h"
#include "decode_attention/smem_plan.h"
#include "ptx/cluster.cuh"
#include "ptx/memory.cuh"
#include "decode_attention/common.cuh"

namespace flint::detail {

// A merge reads at most kMaxFanIn partials in one level: up to three rounds
// of loads (kChunk in flight each) cost less than a second level's arrival
// and store (an L2 round trip each); past that, groups of ceil(sqrt(F)).
template <int E>
struct MergeShape {
  static constexpr int kChunk = 64 / E;  // partials in flight per thread (64 floats of O)
  static constexpr int kMaxFanIn = 3 * kChunk;
};

__device__ __forceinline__ int ceil_sqrt(int f) {
  int r = static_cast<int>(ceilf(sqrtf(static_cast<float>(f))));
  while (r * r < f) ++r;
  while (r > 1 && (r - 1) * (r - 1) >= f) --r;
  return r;
}

// One warp's arrival at a merge's counter, after its lanes stored their
// partials: true in the last of `arrivals` warps, which then merges, and
// resets the counter for the next launch on the stream (zero between
// launches). NOTE: bar.warp.sync orders the lanes' partial stores before
// lane 0's release, and lane 0's acquire before the lanes' loads of the other
// partials (ld.global.cg, never from L1).
__device__ __forceinline__ bool warp_arrives_last(int* counter, int arrivals, int lane) {
  __syncwarp();
  int arrival = 0;
  if (lane == 0) arrival = ptx::atomic_add_acq_rel_gpu(counter, 1);
  arrival = __shfl_sync(kFullMask, arrival, 0);
  __syncwarp();
  const bool last = arrival == arrivals - 1;
  if (last && lane == 0) ptx::st_relaxed_gpu(counter, 0);
  return last;
}

// Merges `count` fp32 partials of one (request, kv head) from the workspace (slot i at
// row row0 + slot_of(i)) into (o, m, l) of head eh, dims [ed, ed + E): kChunk
// partials in flight per thread, each thread loading the (m, l) of its own
// head with the O it weighs, one round of loads per chunk (the running max
// rescales what the earlier chunks summed). Read with ld.global.cg (L2): the
// partials are other CTAs' stores.
template <int E, class SlotOf>
__device__ __forceinline__ void merge_global(const DecodeParams& p, int64_t row0, int count,
                                             SlotOf slot_of, int eh, int ed, float scale_log2,
                                             float (&o)[E], float& m, float& l) {
  constexpr int kChunk = MergeShape<E>::kChunk;
  m = neg_inf();
  l = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = 0.f;
  for (int i0 = 0; i0 < count; i0 += kChunk) {
    float4 v[kChunk][E / 4];
    float mv[kChunk], lv[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const bool in = i0 + c < count;  // past the last: weighs 0
      const int64_t row = row0 + (in ? slot_of(i0 + c) : 0);
      const float* ml = p.part_ml + row * 2 * kRowTile + eh;
      const float* po = p.part_o + row * (kRowTile * kHeadDim) + eh * kHeadDim + ed;
      mv[c] = in ? ptx::ld_global_cg_f32(ml) : neg_inf();
      lv[c] = in ? ptx::ld_global_cg_f32(ml + kRowTile) : 0.f;
#pragma unroll
      for (int i = 0; i < E / 4; ++i)
        v[c][i] = in ? ptx::ld_global_cg_f32x4(po + 4 * i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m_new = m;
#pragma unroll
    for (int c = 0; c < kChunk; ++c) m_new = fmaxf(m_new, mv[c]);
    const float shift = softmax_shift(m_new * scale_log2);
    const float corr = rescale(m, scale_log2, shift);
    l *= corr;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] *= corr;
    add_weighted<E>(o, l, lv, v, [&](int c) { return rescale(mv[c], scale_log2, shift); });
    m = m_new;
  }
}

// In the cluster merge, rank r owns dims [r D, (r + 1) D) of all 8 heads, 8 D
// outputs: the first kThreads threads take kPerThread consecutive dims of one
// head each (with 16 ranks of 8 warps, half the threads have none).
template <int kWarps, int kSplits>
struct ClusterMergeThreads {
  static constexpr int kOutputs = kRowTile * ClusterBufPlan<kSplits>::kDimsPerRank;
  static constexpr int kThreads = kOutputs < 32 * kWarps ? kOutputs : 32 * kWarps;
  static constexpr int kPerThread = kThreads > 0 ? kOutputs / kThreads : 0;
};

// The column whose merged dims thread `tid` writes (any column for threads
// that write none; its sink is read only for a head of the group).
template <int kWarps, int kSplits>
__device__ __forceinline__ int cluster_merge_head(int tid) {
  if constexpr (kSplits == 0) {
    return 0;  // no cluster: never used
  } else {
    using T = ClusterMergeThreads<kWarps, kSplits>;
    return min(tid, T::kThreads - 1) * T::kPerThread / ClusterBufPlan<kSplits>::kDimsPerRank;
  }
}

// Cluster of kSplits CTAs (rank = split): each sends rank r its CTA-merged O
// for dims [r D, (r + 1) D), D = 128 / kSplits, plus (m, l); after one cluster
// barrier every rank merges all splits for its dims and writes them.
template <int kWarps, int kSplits>
__device__ __forceinline__ void cluster_merge(const DecodeParams& p, uint8_t* buf, int split,
                                              int b, int u, int seq_len, int tid, int eh, int ed,
                                              const float (&o)[kRowTile * kHeadDim / (32 * kWarps)],
                                              float m_cta, float l_cta, float sink_scaled,
                                              float scale_log2, float out_scale) {
  using Buf = ClusterBufPlan<kSplits>;
  constexpr int E = kRowTile * kHeadDim / (32 * kWarps);
  constexpr int D = Buf::kDimsPerRank;
  static_assert(E <= D && D % E == 0, "a thread's dims live on one rank");
  const uint32_t local = ptx::smem_addr(buf);
  const int rank = ed / D;
  const uint32_t peer = ptx::map_shared_rank(local, rank);
  ptx::cluster_wait();  // pairs with the early arrive: every peer is running
  const uint32_t dst = peer + ((split * kRowTile + eh) * D + ed % D) * 4;
#pragma unroll
  for (int e = 0; e < E; e += 4) ptx::st_cluster_f32x4(dst + 4 * e, o[e], o[e + 1], o[e + 2], o[e + 3]);
  if (ed % D == 0) {
    ptx::st_cluster_f32(peer + (Buf::kM + split * kRowTile + eh) * 4, m_cta);
    ptx::st_cluster_f32(peer + (Buf::kL + split * kRowTile + eh) * 4, l_cta);
  }
  ptx::cluster_arrive();
  ptx::cluster_wait();

  // This rank owns dims [split D, (split + 1) D) of all 8 columns.
  using T = ClusterMergeThreads<kWarps, kSplits>;
  constexpr int kPerThread = T::kPerThread;
  static_assert(kPerThread >= 1 && kPerThread <= 2, "one bf16 or one bf16 pair per thread");
  if (tid >= T::kThreads) return;  // after the barrier: peers no longer store here
  const float* cb = reinterpret_cast<const float*>(buf);
  const int h = cluster_merge_head<kWarps, kSplits>(tid), dl = tid * kPerThread % D;
  float m = neg_inf();
#pragma unroll
  for (int r = 0; r < kSplits; ++r) m = fmaxf(m, cb[Buf::kM + r * kRowTile + h]);
  const float m_scaled = m * scale_log2, shift = softmax_shift(m_scaled);
  float l = 0.f, acc[kPerThread] = {};
#pragma unroll
  for (int r = 0; r < kSplits; ++r) {
    const float w = rescale(cb[Buf::kM + r * kRowTile + h], scale_log2, shift);
    l += w * cb[Buf::kL + r * kRowTile + h];
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) acc[e] += w * cb[(r * kRowTile + h) * D + dl + e];
  }
  const Column col = column_of(p, u, h);
  uint16_t* const row = out_row_of(p, b, col);
  if (row == nullptr) return;  // a column past the rows
  const float inv =
      normalize_with_sink(out_scale, l, sink_scaled, m_scaled, column_end(p, seq_len, col) > 0);
  if (split == 0 && dl == 0) store_lse(p, b, col, l, sink_scaled, m_scaled);
  uint16_t* dst_out = row + split * D + dl;
  if constexpr (kPerThread == 2) {
    *reinterpret_cast<uint32_t*>(dst_out) = ptx::pack_bf16x2(acc[0] * inv, acc[1] * inv);
  } else {
    const uint32_t w = ptx::pack_bf16x2(acc[0] * inv, 0.f);
    *dst_out = static_cast<uint16_t>(w & 0xffffu);
  }
}

}  // namespace flint::detail
