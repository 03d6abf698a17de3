// Paged decode attention with one warp per (request, kv head), bf16 or fp8
// cache (Kv): no splits and no merge. Warp w of CTA c takes the pair
// c + w x gridDim.x (and every gridDim.x x kWarps-th after it, where the
// launch makes the grid persistent: fewer CTAs than the pairs need, but at
// least one an SM where there are as many pairs; launch_plan.cpp), streams all
// its attended pages through its own ring and writes the normalized output
// straight from its fragments.
//
// Meant for short attended spans at large batch (sliding-window layers), where
// the split kernel's CTAs spend more time on serial latencies (seq_len -> block
// table -> page -> merge) than on bytes: here one CTA carries kWarps pairs and
// no CTA-wide barrier, so a warp's latencies hide behind the other warps'.
// The launch plan picks it (KernelKind::kWarpPerHead) for short windows with
// at least three pairs per SM.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/hopper.h"
#include "decode_attention/kernels/registry.h"
#include "decode_attention/page_ring.cuh"
#include "decode_attention/params.h"
#include "decode_attention/smem_plan.h"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"

namespace flint {

namespace detail {

// One (request, tile) pair and its attended span (seq_extent). seq_len is
// read before griddepcontrol.wait (see kernel_split.cuh).
struct PairSpan {
  int b, u, seq_len, start_tok, start_page, num_pages;
};

__device__ __forceinline__ PairSpan pair_span(const DecodeParams& p, int pair, int raw_len) {
  const int b = pair / p.tiles, u = pair % p.tiles;
  const SeqExtent e = seq_extent(p, raw_len);
  return {b, u, e.seq_len, e.start_tok, e.start_page, e.num_pages};
}

// The pair's pages, page k at ring position ring_base + k.
template <class Kv>
__device__ __forceinline__ PageSpan pair_pages(const DecodeParams& p, const PairSpan& s,
                                               int ring_base) {
  return PageSpan{p.block_tables + s.b * p.bt_stride_b + s.start_page,
                  kv_head_of<Kv>(p, s.u),
                  p.kv_stride_block * Kv::kElemBytes,
                  &p.kv_map,
                  kv_head_of_tile(p, s.u),
                  p.num_blocks,
                  s.start_page,
                  s.num_pages,
                  ring_base,
                  s.start_tok,
                  s.seq_len,
                  1};
}

}  // namespace detail

template <class Kv, int kWarps, int kStages>
__global__ void __launch_bounds__(32 * kWarps)
    decode_attention_warp_per_head_kernel(const __grid_constant__ DecodeParams p) {
  using namespace detail;

  extern __shared__ __align__(1024) uint8_t smem[];  // fp8 ring slots: KvFp8::kSlotAlign
  using Smem = RingSmem<Kv, kWarps, kStages>;
  static_assert(sizeof(Smem) <= hopper::kMaxSmemPerCta, "fits one CTA's shared memory");
  auto& sm = *reinterpret_cast<Smem*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int num_pairs = p.batch * p.tiles;
  // NOTE: a warp without a pair leaves at once; nothing below is CTA-wide.
  const int first = blockIdx.x + warp * gridDim.x;
  if (first >= num_pairs) return;
  if (lane == 0) Kv::prefetch_map(&p.kv_map);
  const Ring<Kv, kStages> ring{sm.ring[warp][0], sm.bars[warp]};
  ring.init(lane);

  // Warp w of CTA c takes pairs c + (w + i x kWarps) x gridDim.x: one pair
  // unless the launch made the grid persistent (fewer CTAs than pairs need,
  // launch_plan.cpp); its ring goes on from pair to pair (ring_base). A CTA's
  // warps take pairs gridDim.x apart, so that the batch's padding rows (its
  // last requests, seq_len 0) and its runs of short requests spread over
  // every CTA, and so over every SM, rather than leaving whole CTAs idle.
  // While a pair streams, the next pair's block ids are loaded (its seq_len
  // one pair earlier still), and the slots the stream frees last take the
  // next pair's leading pages: the ring does not drain between pairs.
  const int stride = gridDim.x * kWarps;
  PairSpan cur = pair_span(p, first, p.seq_lens[first / p.tiles]);
  int len_after = first + stride < num_pairs ? p.seq_lens[(first + stride) / p.tiles] : 0;
  int ring_base = 0, carried_bt = 0;
  bool leading_issued = false;
  for (int pair = first; pair < num_pairs; pair += stride) {
    PairSpan next{};
    if (pair + stride < num_pairs) {
      next = pair_span(p, pair + stride, len_after);
      if (pair + 2 * stride < num_pairs)
        len_after = p.seq_lens[(pair + 2 * stride) / p.tiles];
    }
    const Column col0 = column_of(p, cur.u, 2 * t), col1 = column_of(p, cur.u, 2 * t + 1);
    uint16_t* const out0 = out_row_of(p, cur.b, col0);
    uint16_t* const out1 = out_row_of(p, cur.b, col1);
    // Sinks are weights, never written by the previous kernel: read them first.
    const float sink0 = sink_log2_of(p, col0);
    const float sink1 = sink_log2_of(p, col1);

    if (cur.num_pages <= 0) {
      ptx::grid_dependency_wait();  // the previous kernel may still read `out`
      const float zeros[Kv::kOFloats] = {};
      store_warp_out<Kv>(out0, out1, zeros, 0.f, 0.f, g, t);
      if (g == 0) {
        store_lse(p, cur.b, col0, 0.f, sink0, neg_inf());
        store_lse(p, cur.b, col1, 0.f, sink1, neg_inf());
      }
      cur = next;
      leading_issued = false;
      continue;
    }

    // ---- this warp's pages: start_page + k, k < num_pages; then the next pair's
    const PageSpan span = pair_pages<Kv>(p, cur, ring_base);
    const BlockIds ids{leading_issued ? carried_bt : span.block_at(lane), span.block_at(lane + 32)};
    NextSpan after{pair_pages<Kv>(p, next, ring_base + cur.num_pages), 0};
    const bool chain = next.num_pages > 0 && cur.num_pages >= kStages - 1;
    if (chain) after.bt = after.span.block_at(lane);
    else after.span.count = 0;
    // NOTE: refilling the previous pair's slots needs no extra __syncwarp: the
    // leading pages go to slots that pair consumed before its last page (the
    // __syncwarp that began its last iteration ordered those reads), and the
    // slot of its last page is refilled after the __syncwarp of this pair's
    // first iteration.

    // ---- prefetch, wait on the previous kernel, stream pages -----------------
    // (after the first pair, griddepcontrol.wait returns at once.)
    WarpState<Kv> st;
    const HeadScales sc = wait_then_stream<Kv, kStages, true>(
        p, ring, span, ids, cur.b, cur.u, g, t, lane, st, leading_issued, &after);

    // ---- normalize with the sink term and store ------------------------------
    const float inv0 = normalize_with_sink(sc.out, st.l[0], sink0, st.m[0] * sc.logits_log2,
                                           column_end(p, cur.seq_len, col0) > 0);
    const float inv1 = normalize_with_sink(sc.out, st.l[1], sink1, st.m[1] * sc.logits_log2,
                                           column_end(p, cur.seq_len, col1) > 0);
    store_warp_out<Kv>(out0, out1, st.o, inv0, inv1, g, t);
    if (g == 0) {
      store_lse(p, cur.b, col0, st.l[0], sink0, st.m[0] * sc.logits_log2);
      store_lse(p, cur.b, col1, st.l[1], sink1, st.m[1] * sc.logits_log2);
    }
    ring_base += cur.num_pages;
    cur = next;
    leading_issued = chain;
    carried_bt = after.bt;
  }
}

template <class Kv, int kWarps, int kStages>
KernelEntry warp_per_head_entry() {
  return {reinterpret_cast<const void*>(
              &decode_attention_warp_per_head_kernel<Kv, kWarps, kStages>),
          static_cast<int>(sizeof(detail::RingSmem<Kv, kWarps, kStages>))};
}

}  // namespace flint
