// Split-KV paged decode attention for Hopper (sm_90a), bf16 or fp8 cache (Kv).
//
// Grid (splits, tiles, batch); 32 x kWarps threads per CTA. A tile is a row
// tile of a kv head (common.cuh). The splits x batch CTAs of a tile are
// divided among its requests by their lengths (cta_share; a cluster's ranks
// are its request's splits), and the attended pages of one (request, tile)
// are interleaved over all warps of its active splits. Each warp streams
// whole pages (16 tokens x [K | V]) through a private ring of kStages
// shared-memory slots filled by bulk copies, and runs S^T = K Q^T and O^T +=
// V^T P^T on the tensor cores with the tile's 8 query rows as the n = 8
// dimension. The warps of a CTA merge through shared memory; several splits
// merge either in the last warp to arrive for each column (fp32 partials in a
// global workspace) or, with kClusterSplits > 0,
// through the distributed shared memory of a thread-block cluster.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/hopper.h"
#include "decode_attention/kernels/registry.h"
#include "decode_attention/merge.cuh"
#include "decode_attention/page_ring.cuh"
#include "decode_attention/params.h"
#include "decode_attention/probes.cuh"
#include "decode_attention/smem_plan.h"
#include "ptx/bulk_copy.cuh"
#include "ptx/cluster.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"
#include "ptx/mma.cuh"

namespace flint {

namespace detail {

// Which request of the batch, and which of its splits, a CTA of one tile
// takes. The tile's CTAs (at most `active` of them streaming: one wave)
// are divided among the requests on the device, from their actual lengths:
// one each, and the rest in proportion to each request's share of the
// batch's attended pages (rounded down), so that a long request among short
// or empty ones (padding rows) gets the CTAs they do not need; with equal
// lengths each gets the same number, as a fixed grid would give. CTA f takes
// split f - first of the request whose CTAs [first, first + ctas) hold f;
// CTAs past the last request's take none (b = -1). Every warp computes it
// alike (its lanes take 32 requests at a time).
struct CtaShare {
  int b, split, ctas, first;
};

__device__ __forceinline__ CtaShare cta_share(const DecodeParams& p, int f, int active, int lane) {
  auto pages_of = [&](int b) {
    return b < p.batch ? max(seq_extent(p, p.seq_lens[b]).num_pages, 0) : 0;
  };
  int total = 0;
  for (int b0 = 0; b0 < p.batch; b0 += 32) total += pages_of(b0 + lane);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(kFullMask, total, off);
  const int64_t spare = active - p.batch;
  int base = 0;
  for (int b0 = 0; b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    const int ctas = b < p.batch ? request_ctas(spare, pages_of(b), total) : 0;
    const int incl = warp_inclusive_sum(ctas, lane);
    const int first = base + incl - ctas;
    const unsigned hit = __ballot_sync(kFullMask, f >= first && f < first + ctas);
    if (hit != 0) {
      const int src = __ffs(hit) - 1;
      const int hit_first = __shfl_sync(kFullMask, first, src);
      return {b0 + src, f - hit_first, __shfl_sync(kFullMask, ctas, src), hit_first};
    }
    base += __shfl_sync(kFullMask, incl, 31);
  }
  return {-1, 0, 0, 0};
}

}  // namespace detail

// The split kernel's body (decode_attention_kernel below), with its probe.
template <class Kv, int kWarps, int kStages, int kClusterSplits, class Probe>
__device__ __forceinline__ void split_attention(const DecodeParams& p, Probe& probe) {
  using namespace detail;
  static_assert(kWarps == 4 || kWarps >= 8, "the epilogue maps 1024 outputs onto 128 or 256 threads");
  static_assert(kClusterSplits == 0 || kWarps <= 8, "every thread of a cluster rank merges");
  // Warps that run the epilogue (CTA merge onwards): all of them up to 8;
  // beyond 8 the others only stream pages (more warps per split, so fewer
  // splits and CTAs give each warp the same pages). Thread tid < 32
  // kMergeWarps owns E consecutive dims [ed, ed + E) of head eh.
  constexpr int kMergeWarps = kWarps < 8 ? kWarps : 8;
  constexpr int E = kRowTile * Kv::kHeadDim / (32 * kMergeWarps);
  constexpr int kThreadsPerHead = Kv::kHeadDim / E;

  extern __shared__ __align__(1024) uint8_t smem[];  // fp8 ring slots: KvFp8::kSlotAlign
  using Smem = SplitSmem<Kv, kWarps, kStages, kClusterSplits>;
  static_assert(sizeof(Smem) <= hopper::kMaxSmemPerCta, "fits one CTA's shared memory");
  auto& sm = *reinterpret_cast<Smem*>(smem);
  const int u = blockIdx.y;  // the tile: a row tile of a kv head
  const int max_splits = gridDim.x;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const bool merges = warp < kMergeWarps;
  if (tid == 0) Kv::prefetch_map(&p.kv_map);
  probe.at(kSplitEntered);

  // ---- this CTA's request and split ---------------------------------------
  // NOTE: seq_lens and block tables are read before griddepcontrol.wait: they
  // are written by host-to-device copies ahead of the forward, never by the
  // kernel this one overlaps with.
  // A cluster's ranks are its request's splits (blockIdx.x); one split per
  // request leaves nothing to divide. Otherwise cta_share from the lengths.
  // Workspace partials: row u x (CTAs of a tile) + CTA.
  int b = blockIdx.z, split = blockIdx.x, first_cta = b * max_splits;
  int cap = min(max_splits, p.max_active_splits);
  if constexpr (kClusterSplits == 0) {
    if (max_splits > 1) {
      const CtaShare share = cta_share(p, b * max_splits + split, cap * p.batch, lane);
      if (share.b < 0) return;
      b = share.b;
      split = share.split;
      cap = share.ctas;
      first_cta = share.first;
    }
  }
  const int64_t partial_row0 = int64_t(u) * max_splits * p.batch + first_cta;
  const int eh = merges ? tid / kThreadsPerHead : 0, ed = (tid % kThreadsPerHead) * E;
  const int bh = b * p.tiles + u;
  // Thread (eh, ed) stores column eh's dims where it has a query row.
  const Column col = column_of(p, u, eh);
  const bool stores = merges && col.token >= 0;
  // NOTE: sinks are weights, never written by the kernel this one overlaps
  // with: read them first so that the epilogue never waits on a global load.
  const float sink_scaled = sink_log2_of(p, col);
  const float cluster_sink_scaled =
      kClusterSplits > 0 ? sink_log2_of(p, column_of(p, u, cluster_merge_head<kWarps, kClusterSplits>(tid)))
                         : 0.f;

  // ---- sequence extent ---------------------------------------------------
  const auto [seq_len, start_tok, start_page, num_pages] = seq_extent(p, p.seq_lens[b]);
  // A split is active when each of its warps gets at least min_pages pages and
  // it is one of the request's `cap` CTAs (one wave in all, see cta_share),
  // and of those only as many as give each warp the same largest number of pages: the SMs left
  // over let the next call's CTAs in before this call ends. Warps past the
  // kMergeWarps stream only where they lower that number of splits (b1 L8k:
  // 15 of 9 warps instead of 16 of 8); elsewhere they would only add pages in
  // flight. A cluster keeps every rank active (each one merges a slice of the
  // dims).
  int num_splits = max_splits, stream_warps = kWarps;
  if constexpr (kClusterSplits == 0) {
    const SplitStreams s = split_streams(max(num_pages, 1), kWarps, kMergeWarps, cap, p.min_pages);
    num_splits = s.splits;
    stream_warps = s.warps;
  }
  probe.at(kSplitShared);

  // Column eh's dims of the output, normalized with the sink term, and its
  // log-sum-exp. Its row is found here, not above, to keep registers free for
  // the stream (the 9-warp kernel is at its 168-register cap).
  const auto finish = [&](const float(&o)[E], float v, float l, float m_scaled) {
    const Column c = column_of(p, u, eh);
    store_out<E>(out_row_of(p, b, c) + ed, o,
                 normalize_with_sink(v, l, sink_scaled, m_scaled, column_end(p, seq_len, c) > 0));
    if (ed == 0) store_lse(p, b, c, l, sink_scaled, m_scaled);
  };
  if (num_pages <= 0) {
    // ---- empty sequence: zeros ----------------------------------------------
    ptx::grid_dependency_wait();  // the previous kernel may still read `out`
    if (split == 0 && stores) {
      float zeros[E] = {};
      store_out<E>(out_row_of(p, b, col) + ed, zeros, 0.f);
      if (ed == 0) store_lse(p, b, col, 0.f, sink_scaled, neg_inf());
    }
    return;
  }
  if (split >= num_splits) return;

  // ---- this warp's pages --------------------------------------------------
  // Warp gw of the (request, kv head) takes pages start_page + gw + k * warps_total.
  const int warps_total = num_splits * stream_warps;
  const int gw = split * stream_warps + warp;
  const int n_pages = warp < stream_warps ? interleaved_pages(num_pages, gw, warps_total) : 0;
  const PageSpan span{p.block_tables + b * p.bt_stride_b + start_page + gw,
                      kv_head_of<Kv>(p, u),
                      p.kv_stride_block * Kv::kElemBytes,
                      &p.kv_map,
                      kv_head_of_tile(p, u),
                      p.num_blocks,
                      start_page + gw,
                      n_pages,
                      0,
                      start_tok,
                      seq_len,
                      warps_total};
  const Ring<Kv, kStages> ring{sm.ring[warp][0], sm.bars[warp]};
  const BlockIds ids = BlockIds::first(span, lane);
  ring.init(lane);
  if constexpr (kClusterSplits > 0) {
    // Peers must be running before anyone stores into their shared memory;
    // waited on in cluster_merge, long after the pages are streamed.
    ptx::cluster_arrive_relaxed();
  }

  // ---- prefetch, wait on the previous kernel, stream pages -------------------
  WarpState<Kv> st;
  const HeadScales sc =
      wait_then_stream<Kv, kStages>(p, ring, span, ids, b, u, g, t, lane, st, false, nullptr, &probe);
  probe.at(kSplitStreamed);

  // ---- merge the warps of this CTA (through the ring's shared memory) -------
  __syncthreads();  // every warp is done with its ring
  WarpPartial<Kv>* warp_bufs = sm.partials;
  store_partial<Kv>(warp_bufs[warp], st, g, t);
  __syncthreads();
  if (!merges) return;

  float m_cta = neg_inf();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m_cta = fmaxf(m_cta, warp_bufs[w].m[eh]);
  const float m_cta_scaled = m_cta * sc.logits_log2, shift = softmax_shift(m_cta_scaled);
  float l_cta = 0.f;
  float o[E] = {};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const WarpPartial<Kv>& buf = warp_bufs[w];
    const float corr = rescale(buf.m[eh], sc.logits_log2, shift);
    l_cta += corr * buf.l[eh];
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      const float4 x = partial_o4<Kv>(buf, eh, ed + e);
      o[e] += corr * x.x;
      o[e + 1] += corr * x.y;
      o[e + 2] += corr * x.z;
      o[e + 3] += corr * x.w;
    }
  }
  if constexpr (kClusterSplits > 0) {
    // ---- merge the splits of the cluster ------------------------------------
    cluster_merge<kWarps, kClusterSplits>(p, reinterpret_cast<uint8_t*>(sm.cluster), split, b,
                                          u, seq_len, tid, eh, ed, o, m_cta, l_cta, cluster_sink_scaled,
                                          sc.logits_log2, sc.out);
    probe.at(kSplitCtaMerged);
  } else if (num_splits == 1) {
    if (stores) finish(o, sc.out, l_cta, m_cta_scaled);
    probe.at(kSplitCtaMerged);
  } else {
    // ---- merge the splits: partials to the workspace -------------------------
    store_global_partial<E>(p, partial_row0 + split, o, m_cta, l_cta, eh, ed);
    probe.at(kSplitCtaMerged);
    // ---- each warp: arrive for its heads, merge them if last -----------------
    // Per warp, not per CTA: no bar.sync on the way, and the merges of a
    // pair's heads run in parallel. Past MergeShape's fan-in, two levels:
    // groups of ceil(sqrt(splits)) consecutive splits, each merged by its
    // last warp to arrive into the row of its first split, then the groups'
    // rows merged by the last group to arrive, so that no warp reads more
    // than ~sqrt(splits) partials in a row.
    const bool two_levels = num_splits > MergeShape<E>::kMaxFanIn;
    const int group = two_levels ? ceil_sqrt(num_splits) : num_splits;
    const int leader = split / group * group;
    int* const pair_counter = p.counters + int64_t(bh) * kMergeWarps + warp;
    int* const counter =
        two_levels ? p.counters + (int64_t(p.batch) * p.tiles + partial_row0 + leader) *
                                      kMergeWarps + warp
                   : pair_counter;
    // One copy of the merge for both levels (the merging warp fetches its
    // code cold at the end of the call): level 1 takes the group's rows at
    // stride 1, level 2 the groups' first rows at stride `group`.
    int64_t row0 = partial_row0 + leader;
    int count = min(group, num_splits - leader), stride = 1;
    bool last_level = !two_levels;
    for (int* c = counter;; c = pair_counter) {
      const bool last = warp_arrives_last(c, count, lane);
      probe.at(kSplitArrived);
      if (!last) return;
      float m, l;
      merge_global<E>(p, row0, count, [&](int i) { return i * stride; }, eh, ed, sc.logits_log2,
                      o, m, l);
      if (last_level) {
        if (stores) finish(o, sc.out, l, m * sc.logits_log2);
        probe.at(kSplitFinished);
        return;
      }
      __syncwarp();  // every lane's loads of the group's rows before this store
      store_global_partial<E>(p, row0, o, m, l, eh, ed);
      row0 = partial_row0;
      count = (num_splits + group - 1) / group;
      stride = group;
      last_level = true;
    }
  }
}

template <class Kv, int kWarps, int kStages, int kClusterSplits>
__global__ void __launch_bounds__(32 * kWarps, 1)
    decode_attention_kernel(const __grid_constant__ DecodeParams p) {
  NoSplitProbe probe;
  split_attention<Kv, kWarps, kStages, kClusterSplits>(p, probe);
}

template <class Kv, int kWarps, int kStages, int kClusterSplits>
KernelEntry split_entry() {
  return {reinterpret_cast<const void*>(
              &decode_attention_kernel<Kv, kWarps, kStages, kClusterSplits>),
          static_cast<int>(sizeof(detail::SplitSmem<Kv, kWarps, kStages, kClusterSplits>))};
}

}  // namespace flint
