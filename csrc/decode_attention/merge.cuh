// Merging the splits of one (request, kv head): in the last warp to arrive for
// each head, from fp32 partials in global memory, or inside a thread-block
// cluster through distributed shared memory. Both finish softmax with the sink term:
//   out = v sum_s w_s O_s / (sum_s w_s l_s + 2^(sink log2(e) - M c)),
//   w_s = 2^(m_s c - M c), M = max_s m_s, c = the logits' scale x log2(e)
//   (x k_scale x 2^e for fp8, warp_pages.cuh's HeadScales), v = v_scale (1 for bf16).
#pragma once

#include "decode_attention/params.h"
#include "decode_attention/smem_plan.h"
#include "ptx/cluster.cuh"
#include "ptx/memory.cuh"
#include "decode_attention/common.cuh"

namespace flint::detail {

// The last warp of a (request, kv head) to arrive for its heads (kGqa /
// kWarps of them; the lane owns dims [ed, ed + E) of head eh) merges them from
// all `num_splits` fp32 partials (workspace rows row0 + s), in registers:
// each lane loads the (m, l) of its own head with the partial O it weighs, so
// no shared memory, no __syncthreads and no shuffle stands between the loads
// and the sums. Chunks of kChunk splits keep 64 floats of O in flight per lane.
template <int kWarps>
__device__ __forceinline__ void merge_splits(const DecodeParams& p, int64_t row0, int num_splits,
                                             int eh, int ed, float sink_scaled, float scale_log2,
                                             float out_scale, uint16_t* out_row) {
  constexpr int E = kGqa * kHeadDim / (32 * kWarps);
  constexpr int kChunk = 64 / E;
  const float* po = p.part_o + row0 * (kGqa * kHeadDim) + eh * kHeadDim + ed;
  // Split s: m at pm[2 kGqa s], l at pm[2 kGqa s + kGqa].
  const float* pm = p.part_ml + row0 * 2 * kGqa + eh;
  float4 v[kChunk][E / 4];
  float mv[kChunk], lv[kChunk];
  auto load_chunk = [&](int s0) {
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      // Splits past the last weigh 0 (m = -inf, l = 0, O = 0).
      const int s = s0 + c;
      const bool in = s < num_splits;
      mv[c] = in ? ptx::ld_global_cg_f32(pm + s * 2 * kGqa) : neg_inf();
      lv[c] = in ? ptx::ld_global_cg_f32(pm + s * 2 * kGqa + kGqa) : 0.f;
#pragma unroll
      for (int i = 0; i < E / 4; ++i)
        v[c][i] = in ? ptx::ld_global_cg_f32x4(po + int64_t(s) * (kGqa * kHeadDim) + 4 * i)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load_chunk(0);
  // The max over all splits: the first chunk's from registers, any further
  // split's m loaded on its own (more than kChunk splits only).
  float m = neg_inf();
#pragma unroll
  for (int c = 0; c < kChunk; ++c) m = fmaxf(m, mv[c]);
  for (int s = kChunk; s < num_splits; ++s) m = fmaxf(m, ptx::ld_global_cg_f32(pm + s * 2 * kGqa));
  const float m_scaled = m * scale_log2, shift = softmax_shift(m_scaled);

  float l = 0.f, o[E] = {};
  for (int s0 = 0;;) {
    // Padding (and a split whose logits were all -inf): 2^-inf = 0.
    add_weighted<E>(o, l, lv, v,
                    [&](int c) { return ptx::ex2(fmaf(mv[c], scale_log2, -shift)); });
    s0 += kChunk;
    if (s0 >= num_splits) break;
    load_chunk(s0);
  }
  store_out<E>(out_row + ed, o, out_scale / (l + ptx::ex2(sink_scaled - m_scaled)));
}

// In the cluster merge, rank r owns dims [r D, (r + 1) D) of all 8 heads, 8 D
// outputs: the first kThreads threads take kPerThread consecutive dims of one
// head each (with 16 ranks of 8 warps, half the threads have none).
template <int kWarps, int kSplits>
struct ClusterMergeThreads {
  static constexpr int kOutputs = kGqa * ClusterBufPlan<kSplits>::kDimsPerRank;
  static constexpr int kThreads = kOutputs < 32 * kWarps ? kOutputs : 32 * kWarps;
  static constexpr int kPerThread = kThreads > 0 ? kOutputs / kThreads : 0;
};

// The head whose merged dims thread `tid` writes (any valid head for threads
// that write none, so that its sink can be read unconditionally).
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
                                              int b, int kvh, int tid, int eh, int ed,
                                              const float (&o)[kGqa * kHeadDim / (32 * kWarps)],
                                              float m_cta, float l_cta, float sink_scaled,
                                              float scale_log2, float out_scale) {
  using Buf = ClusterBufPlan<kSplits>;
  constexpr int E = kGqa * kHeadDim / (32 * kWarps);
  constexpr int D = Buf::kDimsPerRank;
  static_assert(E <= D && D % E == 0, "a thread's dims live on one rank");
  const uint32_t local = ptx::smem_addr(buf);
  const int rank = ed / D;
  const uint32_t peer = ptx::map_shared_rank(local, rank);
  ptx::cluster_wait();  // pairs with the early arrive: every peer is running
  const uint32_t dst = peer + ((split * kGqa + eh) * D + ed % D) * 4;
#pragma unroll
  for (int e = 0; e < E; e += 4) ptx::st_cluster_f32x4(dst + 4 * e, o[e], o[e + 1], o[e + 2], o[e + 3]);
  if (ed % D == 0) {
    ptx::st_cluster_f32(peer + (Buf::kM + split * kGqa + eh) * 4, m_cta);
    ptx::st_cluster_f32(peer + (Buf::kL + split * kGqa + eh) * 4, l_cta);
  }
  ptx::cluster_arrive();
  ptx::cluster_wait();

  // This rank owns dims [split D, (split + 1) D) of all 8 heads.
  using T = ClusterMergeThreads<kWarps, kSplits>;
  constexpr int kPerThread = T::kPerThread;
  static_assert(kPerThread >= 1 && kPerThread <= 2, "one bf16 or one bf16 pair per thread");
  if (tid >= T::kThreads) return;  // after the barrier: peers no longer store here
  const float* cb = reinterpret_cast<const float*>(buf);
  const int h = cluster_merge_head<kWarps, kSplits>(tid), dl = tid * kPerThread % D;
  float m = neg_inf();
#pragma unroll
  for (int r = 0; r < kSplits; ++r) m = fmaxf(m, cb[Buf::kM + r * kGqa + h]);
  const float m_scaled = m * scale_log2, shift = softmax_shift(m_scaled);
  float l = 0.f, acc[kPerThread] = {};
#pragma unroll
  for (int r = 0; r < kSplits; ++r) {
    const float w = rescale(cb[Buf::kM + r * kGqa + h], scale_log2, shift);
    l += w * cb[Buf::kL + r * kGqa + h];
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) acc[e] += w * cb[(r * kGqa + h) * D + dl + e];
  }
  const float inv = out_scale / (l + ptx::ex2(sink_scaled - m_scaled));
  uint16_t* dst_out =
      p.out + b * p.out_stride_b + (kvh * kGqa + h) * p.out_stride_h + split * D + dl;
  if constexpr (kPerThread == 2) {
    *reinterpret_cast<uint32_t*>(dst_out) = ptx::pack_bf16x2(acc[0] * inv, acc[1] * inv);
  } else {
    const uint32_t w = ptx::pack_bf16x2(acc[0] * inv, 0.f);
    *dst_out = static_cast<uint16_t>(w & 0xffffu);
  }
}

}  // namespace flint::detail
