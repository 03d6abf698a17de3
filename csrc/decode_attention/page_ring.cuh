// A warp's private ring of page slots, the same in every kernel family (split,
// warp-per-head, balanced), for either cache format (Kv: kv_format.cuh's
// KvBf16 or KvFp8): bulk copies of pages (16 tokens x [K | V]; bf16: their
// attended rows) complete on one mbarrier per slot, and the warp streams runs
// of pages (spans) through the online softmax, the ring going on from one span
// to the next without draining.
#pragma once

#include <cstdint>
#include <type_traits>

#include "decode_attention/common.cuh"
#include "decode_attention/kv_format.cuh"
#include "decode_attention/online_softmax.cuh"
#include "decode_attention/params.h"
#include "decode_attention/probes.cuh"
#include "ptx/bulk_copy.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"

namespace flint::detail {

// One warp's shared memory: its page slots while it streams, then a partial
// (the ring is free once its last page is consumed).
template <class Kv, int kStages>
struct WarpRing {
  static_assert(kStages >= 2, "a ring needs a slot being consumed and one in flight");
  static_assert(sizeof(WarpPartial<Kv>) <= kStages * Kv::kPageBytes, "the ring holds a partial");
  union {
    alignas(Kv::kSlotAlign > 128 ? Kv::kSlotAlign : 128) uint8_t slots[kStages][Kv::kPageBytes];
    WarpPartial<Kv> last;
  };
};

// Ring position n (the n-th page this warp streams) uses slot n % kStages and
// completes its barrier's phase with parity (n / kStages) & 1.
template <class Kv, int kStages>
struct Ring {
  uint8_t* slots;       // a WarpRing's slot 0
  ptx::Mbarrier* bars;  // [kStages]

  __device__ __forceinline__ uint8_t* slot(int n) const {
    return slots + (n % kStages) * Kv::kPageBytes;
  }
  __device__ __forceinline__ ptx::Mbarrier& bar(int n) const { return bars[n % kStages]; }
  __device__ __forceinline__ static uint32_t parity(int n) { return (n / kStages) & 1; }

  // One expected arrival per slot: lane 0's expect_tx.
  __device__ __forceinline__ void init(int lane) const {
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(bars[s], 1);
      ptx::fence_mbarrier_init();
    }
    __syncwarp();
  }
};

// `count` pages of one (request, kv head): page k (k < count) is the
// request's page first_page + k * step, at ring position ring_base + k. A
// balanced piece is a run of consecutive pages (step 1); a split stream
// interleaves the request's pages over its warps (step: their number).
struct PageSpan {
  const int32_t* bt;       // block-table entry of page k = 0; page k at bt[k * step]
  const uint8_t* kv_head;  // the cache at this kv head: + block x stride_block is a page
  int64_t stride_block;    // bytes
  const KvTensorMap* map;  // the cache's tensor map (fp8) and this kv head in it
  int head;
  int num_blocks;          // block ids are clamped to [0, num_blocks)
  int first_page, count, ring_base;
  int start_tok, seq_len;  // the attended tokens (a bf16 copy brings only a page's rows of them)
  int step;

  __device__ __forceinline__ int page(int k) const { return first_page + k * step; }
  __device__ __forceinline__ int block_at(int k) const {
    return k < count ? min(max(bt[k * step], 0), num_blocks - 1) : 0;
  }
};

// A span's block ids, 32 pages at a time: lane i holds those of pages 32j + i
// (cur) and 32j + 32 + i (next) while the producer is in pages [32j, 32j + 32).
struct BlockIds {
  int cur, next;

  __device__ __forceinline__ static BlockIds first(const PageSpan& s, int lane) {
    return {s.block_at(lane), s.block_at(lane + 32)};
  }
  // Page k's block, k in the current 32 (every lane takes part).
  __device__ __forceinline__ int of(int k) const { return __shfl_sync(kFullMask, cur, k & 31); }
  // Moving on to page k: at a multiple of 32, the next 32 pages' ids.
  __device__ __forceinline__ void advance(const PageSpan& s, int k, int lane) {
    if ((k & 31) == 0) {
      cur = next;
      next = s.block_at(k + 32 + lane);
    }
  }
};

// Copies page k of `s` (block `block`) into its slot: lane 0 sets the bytes
// its barrier expects, then issues the copy.
template <class Kv, int kStages, class Probe = NoStreamProbe>
__device__ __forceinline__ void issue_page(const Ring<Kv, kStages>& ring, const PageSpan& s, int k,
                                           int block, int lane, Probe&& probe = Probe{}) {
  if (lane == 0) {
    const int n = s.ring_base + k;
    const PageRows rows = attended_rows(s.page(k), s.start_tok, s.seq_len);
    ptx::mbarrier_arrive_expect_tx(ring.bar(n), Kv::copy_bytes(rows));
    probe.lap(kRefillArrive);
    Kv::copy_rows(ring.slot(n), s.kv_head + block * s.stride_block, s.map, s.head, block, rows,
                  ring.bar(n), page_l2_policy(k, kStages));
    probe.lap(kRefillCopy);
  }
}

// Issues the span's leading kStages - 1 pages that do (`new_tokens`) or do
// not hold the request's new tokens: pages first_new_page on. Lane i's `bt`
// is the block of page i.
template <class Kv, int kStages>
__device__ __forceinline__ void issue_leading(const Ring<Kv, kStages>& ring, const PageSpan& s,
                                              int bt, int first_new_page, bool new_tokens,
                                              int lane) {
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    const int block = __shfl_sync(kFullMask, bt, k);
    if (k < s.count && (s.page(k) >= first_new_page) == new_tokens)
      issue_page(ring, s, k, block, lane);
  }
}

// The first page holding one of the request's q_tokens new tokens (positions
// seq_len - q_tokens on): the previous kernel writes their K/V.
__device__ __forceinline__ int first_new_page(const DecodeParams& p, int seq_len) {
  return max(seq_len - p.q_tokens, 0) / kPageTokens;
}

// A warp's prologue in the order PDL allows, the same in every kernel: the
// leading pages that do not depend on the previous kernel, then
// griddepcontrol.wait, then the pages holding the new tokens (the previous
// kernel writes their K/V: pages `first_new` on, first_new_page). `past_wait`
// runs between the two.
// launch_dependents comes right after the wait: a PDL-launched successor
// starts once every CTA here is past its wait (the call before has ended), so
// its prologue overlaps this call's stream wherever an SM has room, and at
// most two calls are ever resident. At kernel entry instead, each successor
// would trigger its own at once and calls would pile up (a short sliding
// window call took half as long again); after the stream, nothing overlaps.
// leading_issued: an earlier stream of the ring issued these already (a
// persistent warp-per-head warp's previous pair, past its wait).
// `probe`, if any, is told when the leading pages are out and the wait is over.
template <class Kv, int kStages, class Probe, class PastWait>
__device__ __forceinline__ void pdl_prologue(const Ring<Kv, kStages>& ring, const PageSpan& s,
                                             int bt, int first_new, bool leading_issued,
                                             int lane, Probe* probe, PastWait&& past_wait) {
  if (!leading_issued) issue_leading(ring, s, bt, first_new, false, lane);
  if (probe) probe->leading_issued();
  ptx::grid_dependency_wait();
  if (probe) probe->waited();
  ptx::launch_dependents();
  past_wait();
  if (!leading_issued) issue_leading(ring, s, bt, first_new, true, lane);
}

// One step of a stream: the slots consumed before it take their next pages
// (`refill`, after a __syncwarp of its own: every lane's shared-memory reads of
// a slot must be done before lane 0 hands it to the copy engine), and the
// step's pages are waited for (`wait`). Refilled after the wait, the ring keeps
// one page fewer in flight: where the grid streams enough warps, fewer bytes
// queue at HBM in front of everyone's next page.
template <class Refill, class Wait>
__device__ __forceinline__ void refill_and_wait(bool refill_after_wait, Refill&& refill,
                                                Wait&& wait) {
  if (!refill_after_wait) refill();
  wait();
  if (refill_after_wait) refill();
}

template <class Kv>
__device__ __forceinline__ void reset_state(WarpState<Kv>& st) {
  st.m[0] = st.m[1] = neg_inf();
  st.l[0] = st.l[1] = 0.f;
#pragma unroll
  for (int i = 0; i < Kv::kOFloats; ++i) st.o[i] = 0.f;
}

// st.l summed over the warp's lanes (each holds tokens g and g + 8 of a page).
template <class Kv>
__device__ __forceinline__ void sum_rows(WarpState<Kv>& st) {
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    st.l[0] += __shfl_xor_sync(kFullMask, st.l[0], off);
    st.l[1] += __shfl_xor_sync(kFullMask, st.l[1], off);
  }
}

// ---- the split and warp-per-head kernels: one span a stream -------------------

// The span a warp streams after this one (kChain): the next pair of a
// persistent warp-per-head warp, at ring positions going on from this span's
// end, and lane i's block id of its page i (i < 32). count 0: none.
struct NextSpan {
  PageSpan span;
  int bt;
};

// Streams all of the span's pages (the leading ones already issued) through
// the online softmax, a page a step; returns with st.l summed over the lanes.
// kChain: the slots this stream frees last take `next`'s leading pages, so
// the ring never drains between two pairs (needs s.count >= kStages - 1).
template <class Kv, int kStages, bool kChain = false>
__device__ __forceinline__ void stream_span(const Ring<Kv, kStages>& ring, const PageSpan& s,
                                            BlockIds ids, const uint32_t (&q)[Kv::kQWords],
                                            const ColumnSpans& cs, float scale_log2, int g, int t,
                                            int lane, WarpState<Kv>& st, const NextSpan* next,
                                            bool refill_after_wait) {
  reset_state(st);
  for (int k = 0; k < s.count; ++k) {
    // The slot consumed in the previous step takes page k + kStages - 1.
    auto refill = [&] {
      const int kn = k + kStages - 1;
      ids.advance(s, kn, lane);
      __syncwarp();
      const int block = ids.of(kn);
      if (kn < s.count) {
        issue_page(ring, s, kn, block, lane);
      } else if constexpr (kChain) {
        // Ring position ring_base + kn is the next span's page kn - count.
        const int j = kn - s.count;
        const int next_block = __shfl_sync(kFullMask, next->bt, j & 31);
        if (j < kStages - 1 && j < next->span.count) issue_page(ring, next->span, j, next_block, lane);
      }
    };
    refill_and_wait(refill_after_wait, refill, [&] {
      ptx::mbarrier_wait_parity(ring.bar(s.ring_base + k), ring.parity(s.ring_base + k));
    });
    const int page = s.page(k);
    uint32_t kf[Kv::kKvWords], vf[Kv::kKvWords];
    Kv::load_page(ptx::smem_addr(ring.slot(s.ring_base + k)), page, s.start_tok, s.seq_len, g, t,
                  kf, vf);
    attend_page<Kv>(kf, vf, q, page, cs, scale_log2, g, t, st);
  }
  sum_rows(st);
}

// A warp's part of a split or warp-per-head call: the prologue (pdl_prologue),
// then q, the fp8 scales and all pages streamed. Returns the kv head's scales.
// (seq_lens, block tables and sinks are read before this: they are never
// written by the kernel this one overlaps with.)
// Refill::kAfterUnlessLate: a warp whose first page is still in flight past
// the wait entered late (its CTA found an SM only as the previous call ended)
// and streams with the whole ring in flight, twice the share of the HBM queue
// that the warps with one page in flight get, to catch up with them.
template <class Kv, int kStages, bool kChain = false, class Probe = NoPrologueProbe>
__device__ __forceinline__ HeadScales wait_then_stream(
    const DecodeParams& p, const Ring<Kv, kStages>& ring, const PageSpan& s, BlockIds ids, int b,
    int u, int g, int t, int lane, WarpState<Kv>& st, bool leading_issued = false,
    const NextSpan* next = nullptr, Probe* probe = nullptr) {
  bool refill_after_wait;
  pdl_prologue(ring, s, ids.cur, first_new_page(p, s.seq_len), leading_issued, lane, probe, [&] {
    refill_after_wait = p.refill == Refill::kAfterWait;
    if (p.refill == Refill::kAfterUnlessLate && s.count > 0) {
      const int n = s.ring_base;
      const bool landed = ptx::mbarrier_test_parity(ring.bar(n), ring.parity(n));
      refill_after_wait = __shfl_sync(kFullMask, landed, 0);
    }
  });
  const HeadScales unscaled = head_scales<Kv>(p, u);
  uint32_t q[Kv::kQWords];
  const int q_exp = load_q<Kv>(q_row_of(p, b, column_of(p, u, g)), t, q);
  const HeadScales sc = with_q_exponent<Kv>(unscaled, q_exp);
  stream_span<Kv, kStages, kChain>(ring, s, ids, q, column_spans(p, s.seq_len, u, t),
                                   sc.logits_log2, g, t, lane, st, next, refill_after_wait);
  return sc;
}

// ---- the balanced kernel: pieces of a share, one ring position after another --

// Streams the piece `s` through the online softmax into `st`, Kv::kStepPages
// pages a step (one max and rescale round; a piece's odd last page alone),
// and returns with st.l summed over the warp's lanes. Before a step consumes
// positions n .. n + N - 1, fill_to(n + kStages) issues every position below
// n + kStages: the slots of the positions before n, consumed, take the
// warp's next ones whatever piece they belong to.
// `probe` (probes.cuh) is told where the time goes.
template <class Kv, int kStages, class FillTo, class Probe>
__device__ __forceinline__ void stream_piece(const Ring<Kv, kStages>& ring, const PageSpan& s,
                                             FillTo& fill_to, const uint32_t (&q)[Kv::kQWords],
                                             const ColumnSpans& cs, float scale_log2, int g,
                                             int t, bool refill_after_wait, WarpState<Kv>& st,
                                             Probe& probe) {
  constexpr int kStep = Kv::kStepPages;
  static_assert(kStep < kStages, "a step leaves a slot in flight");
  reset_state(st);

  auto step = [&](int k, auto num_pages) {
    constexpr int N = decltype(num_pages)::value;
    const int n = s.ring_base + k;
    auto refill = [&] {
      __syncwarp();
      fill_to(n + kStages);
      probe.lap(kRefill);
    };
    probe.lap(kPageMath);
    refill_and_wait(refill_after_wait, refill, [&] {
#pragma unroll
      for (int i = 0; i < N; ++i) ptx::mbarrier_wait_parity(ring.bar(n + i), ring.parity(n + i));
      probe.lap(k == 0 ? kFirstWait : kPageWait);
    });
    uint32_t kf[N][Kv::kKvWords], vf[N][Kv::kKvWords];
    int pages[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      pages[i] = s.page(k) + i;  // a piece's pages are consecutive (step 1)
      Kv::load_page(ptx::smem_addr(ring.slot(n + i)), pages[i], s.start_tok, s.seq_len, g, t,
                    kf[i], vf[i]);
    }
    attend_pages<Kv, N>(kf, vf, q, pages, cs, scale_log2, g, t, st);
  };
  int k = 0;
  for (; k + kStep <= s.count; k += kStep) step(k, std::integral_constant<int, kStep>{});
  if constexpr (kStep > 1) {
    for (; k < s.count; ++k) step(k, std::integral_constant<int, 1>{});
  }
  sum_rows(st);
  probe.lap(kPageMath);
}

}  // namespace flint::detail
