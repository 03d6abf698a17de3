// A warp's private ring of page slots for the balanced kernel: copies of
// pages (16 tokens x [K | V]; bf16: their attended rows) complete on one
// mbarrier per slot, and the warp streams runs of pages ("pieces") through
// the online softmax, the ring going on from one piece to the next without
// draining.
#pragma once

#include <cstdint>
#include <type_traits>

#include "decode_attention/common.cuh"
#include "decode_attention/fragments.cuh"
#include "decode_attention/params.h"
#include "ptx/bulk_copy.cuh"
#include "ptx/mbarrier.cuh"

namespace flint::detail {

// Where a warp's stream time goes, piece by piece: each probe.lap() gives the
// time since the previous one to a section (the balanced kernel's testing
// build sums them per warp; the operator's build compiles lap() to nothing).
enum StreamSection : int {
  kPieceSetup,    // a piece's inputs and q (or, once, the stream's start past the wait)
  kFirstWait,     // waiting for a piece's first page
  kPageWait,      // waiting for its other pages
  kRefillSync,    // a refill's warp sync and block id
  kRefillArrive,  // its expect_tx (lane 0)
  kRefillCopy,    // its bulk copy (lane 0)
  kRefill,        // the rest of a refill: the producer's bookkeeping
  kPageMath,      // a page's fragments and online softmax
  kPieceEnd,      // a piece's output or partial
  kNumStreamSections
};

// The operator's probe: no stamps.
struct NoStreamProbe {
  __device__ __forceinline__ void lap(StreamSection) {}
};

// One warp's shared memory: its page slots while it streams, then the
// partial of its last piece (the ring is free once that piece is consumed).
template <class Kv, int kStages>
struct WarpRing {
  static_assert(kStages >= 2, "a ring needs a slot being consumed and one in flight");
  static_assert(sizeof(WarpPartial) <= kStages * Kv::kPageBytes, "the ring holds a partial");
  union {
    alignas(Kv::kSlotAlign > 128 ? Kv::kSlotAlign : 128) uint8_t slots[kStages][Kv::kPageBytes];
    WarpPartial last;
  };
};

// Ring position n (the n-th page this warp streams) uses slot n % kStages and
// completes its barrier's phase with parity (n / kStages) & 1.
template <class Kv, int kStages>
struct Ring {
  WarpRing<Kv, kStages>& mem;
  ptx::Mbarrier* bars;  // [kStages]

  __device__ __forceinline__ uint8_t* slot(int n) const { return mem.slots[n % kStages]; }
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

// A run of `count` pages of one (request, kv head): pages first_page + k, the
// k-th at ring position ring_base + k.
struct PieceSpan {
  const int32_t* bt;       // block-table entry of page k = 0; page k at bt[k]
  const uint8_t* kv_head;  // the cache at this kv head: + block x stride_block is a page
  int64_t stride_block;    // bytes
  const KvTensorMap* map;  // the cache's tensor map (fp8) and this kv head in it
  int head;
  int num_blocks;          // block ids are clamped to [0, num_blocks)
  int first_page, count, ring_base;
  int start_tok, seq_len;  // the attended tokens (a bf16 copy brings only a page's rows of them)

  __device__ __forceinline__ int block_at(int k) const {
    return k < count ? min(max(bt[k], 0), num_blocks - 1) : 0;
  }
};

template <class Kv, int kStages, class Probe = NoStreamProbe>
__device__ __forceinline__ void issue_page(const Ring<Kv, kStages>& ring, const PieceSpan& s, int k,
                                           int block, int lane, Probe&& probe = Probe{}) {
  if (lane == 0) {
    const int n = s.ring_base + k;
    const PageRows rows = attended_rows(s.first_page + k, s.start_tok, s.seq_len);
    ptx::mbarrier_arrive_expect_tx(ring.bar(n), Kv::copy_bytes(rows));
    probe.lap(kRefillArrive);
    Kv::copy_rows(ring.slot(n), s.kv_head + block * s.stride_block, s.map, s.head, block, rows,
                  ring.bar(n), page_l2_policy(k, kStages));
    probe.lap(kRefillCopy);
  }
}

// Issues the piece's leading kStages - 1 pages that hold (`current`) or do not
// hold the page `current_page`. Lane i's `bt` is the block of page i.
template <class Kv, int kStages>
__device__ __forceinline__ void issue_leading(const Ring<Kv, kStages>& ring, const PieceSpan& s,
                                              int bt, int current_page, bool current, int lane) {
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    const int block = __shfl_sync(kFullMask, bt, k);
    if (k < s.count && (s.first_page + k == current_page) == current)
      issue_page(ring, s, k, block, lane);
  }
}

// Streams the piece `s` through the online softmax into `st`, Kv::kStepPages
// pages a step (one max and rescale round; a piece's odd last page alone),
// and returns with st.l summed over the warp's lanes. Before a step consumes
// positions n .. n + N - 1, fill_to(n + kStages) issues every position below
// n + kStages: the slots of the positions before n, consumed, take the
// warp's next ones whatever piece they belong to.
// With refill_after_wait a step refills only once its pages have landed:
// fewer pages in flight, a shorter queue at HBM where the grid streams
// enough warps.
// `probe` (kernel_balanced.cuh) is told where the time goes.
template <class Kv, int kStages, class FillTo, class Probe>
__device__ __forceinline__ void stream_piece(const Ring<Kv, kStages>& ring, const PieceSpan& s,
                                             FillTo& fill_to, const uint32_t (&q)[16],
                                             int start_tok, int seq_len, float scale_log2, int g,
                                             int t, bool refill_after_wait, WarpState& st,
                                             Probe& probe) {
  constexpr int kStep = Kv::kStepPages;
  static_assert(kStep < kStages, "a step leaves a slot in flight");
  st.m[0] = st.m[1] = neg_inf();
  st.l[0] = st.l[1] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) st.o[i] = 0.f;

  auto step = [&](int k, auto num_pages) {
    constexpr int N = decltype(num_pages)::value;
    const int n = s.ring_base + k;
    // NOTE: every lane's shared-memory reads of the slots being refilled
    // (the previous steps') must be done before lane 0 hands them to the
    // copy engine.
    auto refill = [&] {
      __syncwarp();
      fill_to(n + kStages);
      probe.lap(kRefill);
    };
    probe.lap(kPageMath);
    if (!refill_after_wait) refill();
#pragma unroll
    for (int i = 0; i < N; ++i) ptx::mbarrier_wait_parity(ring.bar(n + i), ring.parity(n + i));
    probe.lap(k == 0 ? kFirstWait : kPageWait);
    if (refill_after_wait) refill();
    uint32_t kf[N][32], vf[N][32];
    int pages[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      pages[i] = s.first_page + k + i;
      Kv::load_page(ptx::smem_addr(ring.slot(n + i)), pages[i], start_tok, seq_len, g, t, kf[i],
                    vf[i]);
    }
    attend_pages<Kv, N>(kf, vf, q, pages, start_tok, seq_len, scale_log2, g, t, st);
  };
  int k = 0;
  for (; k + kStep <= s.count; k += kStep) step(k, std::integral_constant<int, kStep>{});
  if constexpr (kStep > 1) {
    for (; k < s.count; ++k) step(k, std::integral_constant<int, 1>{});
  }
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    st.l[0] += __shfl_xor_sync(kFullMask, st.l[0], off);
    st.l[1] += __shfl_xor_sync(kFullMask, st.l[1], off);
  }
  probe.lap(kPageMath);
}

}  // namespace flint::detail
