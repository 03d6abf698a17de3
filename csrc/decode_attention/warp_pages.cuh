// One warp's page stream in the split and warp-per-head kernels (bf16 only):
// the bulk copy of a page into a ring slot and the ring that feeds
// fragments.cuh's attend_page.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/fragments.cuh"
#include "decode_attention/params.h"
#include "ptx/bulk_copy.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"
#include "ptx/mma.cuh"

namespace flint::detail {

// Bulk-copies one page (block `block`, this kv head) into a ring slot.
__device__ __forceinline__ void issue_page(const uint16_t* kv_head, int64_t stride_block,
                                           int block, uint32_t slot, uint32_t bar, int lane) {
  if (lane == 0) {
    ptx::mbarrier_arrive_expect_tx(bar, kPageBytes);
    ptx::bulk_copy_g2s(slot, kv_head + block * stride_block, kPageBytes, bar);
  }
}

// A warp's pages of one (request, kv head): pages first_page + k * step for
// k < n_pages, streamed through a private ring of kStages slots (8 KB each,
// one mbarrier per slot). Block ids come 32 at a time into lanes (k = lane and
// k = lane + 32) and are broadcast with shuffles. A ring that streamed
// ring_base pages before (an earlier pair of a persistent warp) goes on where
// it stopped: page k takes ring position ring_base + k (slot, barrier phase).
struct WarpPages {
  const int32_t* bt;         // block-table entry of page k = 0; page k at bt[k * step]
  const uint16_t* kv_head;   // the cache at this kv head: + block x stride_block is a page
  int64_t stride_block;
  int num_blocks;            // block ids are clamped to [0, num_blocks)
  int first_page, step, n_pages;
  uint32_t ring, bars;       // shared-memory addresses of slot 0 and its barrier
  int ring_base = 0;         // pages this ring streamed before page k = 0

  __device__ __forceinline__ int block_at(int k) const {
    return k < n_pages ? min(max(bt[k * step], 0), num_blocks - 1) : 0;
  }
  // Ring slot and barrier of page k, and the parity its barrier completes with.
  template <int kStages>
  __device__ __forceinline__ uint32_t slot_of(int k) const {
    return ring + ((ring_base + k) % kStages) * kPageBytes;
  }
  template <int kStages>
  __device__ __forceinline__ uint32_t bar_of(int k) const {
    return bars + 8 * ((ring_base + k) % kStages);
  }
  template <int kStages>
  __device__ __forceinline__ uint32_t parity_of(int k) const {
    return ((ring_base + k) / kStages) & 1;
  }
};

// One mbarrier per ring slot, each expecting one arrival (lane 0's expect_tx).
template <int kStages>
__device__ __forceinline__ void init_ring_barriers(uint32_t bars, int lane) {
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(bars + 8 * s, 1);
    ptx::fence_mbarrier_init();
  }
  __syncwarp();
}

// Issues the leading kStages - 1 pages that are (`current`) or are not the
// page holding the current token: the latter before griddepcontrol.wait, the
// former after it (the previous kernel writes that page's K/V).
template <int kStages>
__device__ __forceinline__ void issue_leading_pages(const WarpPages& w, int bt_cur,
                                                    int current_page, bool current, int lane) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int blk = __shfl_sync(kFullMask, bt_cur, s);
    if (s < w.n_pages && (w.first_page + s * w.step == current_page) == current)
      issue_page(w.kv_head, w.stride_block, blk, w.slot_of<kStages>(s), w.bar_of<kStages>(s), lane);
  }
}

// The pages a warp streams after these (kChain): the next pair of a
// persistent warp-per-head warp, its ring position going on from this pair's
// end, and lane i's block id of its page i (i < 32). n_pages 0: none.
struct NextPages {
  WarpPages pages;
  int bt;
};

// Streams all of the warp's pages through the online softmax (the leading
// ones already issued); returns with st.l summed over the warp's lanes.
// kChain: the slots this stream frees last take `next`'s leading pages, so
// the ring never drains between two pairs (needs w.n_pages >= kStages - 1).
template <int kStages, bool kChain = false>
__device__ __forceinline__ void stream_pages(const WarpPages& w, int bt_cur, int bt_next,
                                             const uint32_t (&q)[16], int start_tok, int seq_len,
                                             float scale_log2, int g, int t, int lane,
                                             WarpState& st, const NextPages* next = nullptr,
                                             bool refill_after_wait = false) {
  st.m[0] = st.m[1] = neg_inf();
  st.l[0] = st.l[1] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) st.o[i] = 0.f;

  for (int k = 0; k < w.n_pages; ++k) {
    auto refill = [&] {
      // Refill the slot consumed in the previous iteration with page k + kStages - 1.
      const int kn = k + kStages - 1;
      if ((kn & 31) == 0) {
        bt_cur = bt_next;
        bt_next = w.block_at(kn + 32 + lane);
      }
      // NOTE: every lane's shared-memory reads of that slot (previous
      // iteration) must be done before lane 0 hands it to the copy engine.
      __syncwarp();
      const int blk = __shfl_sync(kFullMask, bt_cur, kn & 31);
      if (kn < w.n_pages) {
        issue_page(w.kv_head, w.stride_block, blk, w.slot_of<kStages>(kn), w.bar_of<kStages>(kn),
                   lane);
      } else if constexpr (kChain) {
        // Ring position ring_base + kn is the next pages' page kn - n_pages.
        const int j = kn - w.n_pages;
        const int next_blk = __shfl_sync(kFullMask, next->bt, j & 31);
        if (j < kStages - 1 && j < next->pages.n_pages)
          issue_page(next->pages.kv_head, next->pages.stride_block, next_blk,
                     next->pages.slot_of<kStages>(j), next->pages.bar_of<kStages>(j), lane);
      }
    };
    // Refilled after the wait, the ring keeps one page fewer in flight: where
    // the grid streams enough warps, fewer bytes queue at HBM in front of
    // everyone's next page (see launch_plan.cpp).
    if (!refill_after_wait) refill();
    ptx::mbarrier_wait_parity(w.bar_of<kStages>(k), w.parity_of<kStages>(k));
    if (refill_after_wait) refill();
    const int page = w.first_page + k * w.step;
    uint32_t kf[32], vf[32];
    KvBf16::load_page(w.slot_of<kStages>(k), page, start_tok, seq_len, g, t, kf, vf);
    attend_page<KvBf16>(kf, vf, q, page, start_tok, seq_len, scale_log2, g, t, st);
  }
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    st.l[0] += __shfl_xor_sync(kFullMask, st.l[0], off);
    st.l[1] += __shfl_xor_sync(kFullMask, st.l[1], off);
  }
}

// A warp's part of the call in the order PDL allows, the same in every kernel:
// the leading pages that do not depend on the previous kernel, then
// griddepcontrol.wait, then what the previous kernel writes (the page holding
// the current token, q), and all pages streamed.
// launch_dependents comes right after the wait: a PDL-launched successor
// starts once every CTA here is past its wait (the call before has ended), so
// its prologue overlaps this call's stream wherever an SM has room, and at
// most two calls are ever resident. At kernel entry instead, each successor
// would trigger its own at once and calls would pile up (swa128 b64: 17.0 us
// against 11.0, device runs 9-10); after the stream, nothing overlaps.
// (seq_lens, block tables and sinks are read before this: see kernel.cuh.)
// kChain (persistent warp-per-head): `leading_issued` says the previous
// pair's stream already issued these pages' leading ones (past the wait, so
// the current token's page too), and `next`'s are issued at this stream's end.
template <int kStages, bool kChain = false>
__device__ __forceinline__ void wait_then_stream_pages(const DecodeParams& p, const WarpPages& pages,
                                                       int bt_cur, int bt_next, int b, int kvh,
                                                       int start_tok, int seq_len, int g, int t,
                                                       int lane, WarpState& st,
                                                       bool leading_issued = false,
                                                       const NextPages* next = nullptr) {
  const int current_page = (seq_len - 1) / kPageTokens;
  if (!leading_issued) issue_leading_pages<kStages>(pages, bt_cur, current_page, false, lane);
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  // Refill::kAfterUnlessLate: a warp whose first page is still in flight here
  // entered late (its CTA found an SM only as the previous call ended) and
  // streams with the whole ring in flight, twice the share of the HBM queue
  // that the warps with one page in flight get, to catch up with them.
  bool refill_after_wait = p.refill == Refill::kAfterWait;
  if (p.refill == Refill::kAfterUnlessLate && pages.n_pages > 0) {
    const bool landed = ptx::mbarrier_test_parity(pages.bar_of<kStages>(0),
                                                  pages.parity_of<kStages>(0));
    refill_after_wait = __shfl_sync(kFullMask, landed, 0);
  }
  if (!leading_issued) issue_leading_pages<kStages>(pages, bt_cur, current_page, true, lane);
  uint32_t q[16];
  KvBf16::load_q(p.q + b * p.q_stride_b + (kvh * kGqa + g) * p.q_stride_h, t, q);
  stream_pages<kStages, kChain>(pages, bt_cur, bt_next, q, start_tok, seq_len, p.scale_log2, g, t,
                                lane, st, next, refill_after_wait);
}

}  // namespace flint::detail
