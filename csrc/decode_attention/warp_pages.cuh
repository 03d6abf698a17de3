// One warp's page stream in the split and warp-per-head kernels, for either
// cache format (Kv: fragments.cuh's KvBf16 or KvFp8): the bulk copy of a page
// into a ring slot, the ring that feeds attend_page (one page a step), and the
// scales of a kv head's logits and output.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/fragments.cuh"
#include "decode_attention/numerics.h"
#include "decode_attention/params.h"
#include "ptx/bulk_copy.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"
#include "ptx/mma.cuh"

namespace flint::detail {

// A warp's pages of one (request, kv head): pages first_page + k * step for
// k < n_pages, streamed through a private ring of kStages slots (one page of
// Kv each, one mbarrier per slot). Block ids come 32 at a time into lanes
// (k = lane and k = lane + 32) and are broadcast with shuffles. A ring that
// streamed ring_base pages before (an earlier pair of a persistent warp) goes
// on where it stopped: page k takes ring position ring_base + k (slot, barrier
// phase).
template <class Kv, int kStages>
struct WarpPages {
  const int32_t* bt;         // block-table entry of page k = 0; page k at bt[k * step]
  const uint8_t* kv_head;    // the cache at this kv head: + block x stride_block is a page
  int64_t stride_block;      // bytes
  const KvTensorMap* map;    // the cache's tensor map (fp8) and this kv head in it
  int head;
  int num_blocks;            // block ids are clamped to [0, num_blocks)
  int first_page, step, n_pages;
  int start_tok, seq_len;    // the attended tokens (a bf16 copy brings only a page's rows of them)
  uint8_t* ring;             // slot 0 (kStages slots of Kv::kPageBytes)
  ptx::Mbarrier* bars;       // its barrier (one per slot)
  int ring_base = 0;         // pages this ring streamed before page k = 0

  __device__ __forceinline__ int block_at(int k) const {
    return k < n_pages ? min(max(bt[k * step], 0), num_blocks - 1) : 0;
  }
  // Ring slot and barrier of page k, and the parity its barrier completes with.
  __device__ __forceinline__ uint8_t* slot_of(int k) const {
    return ring + ((ring_base + k) % kStages) * Kv::kPageBytes;
  }
  __device__ __forceinline__ ptx::Mbarrier& bar_of(int k) const {
    return bars[(ring_base + k) % kStages];
  }
  __device__ __forceinline__ uint32_t parity_of(int k) const {
    return ((ring_base + k) / kStages) & 1;
  }
  // Copies page k's attended rows (block `block`) into its slot.
  __device__ __forceinline__ void issue(int k, int block, int lane) const {
    if (lane == 0) {
      const PageRows rows = attended_rows(first_page + k * step, start_tok, seq_len);
      ptx::mbarrier_arrive_expect_tx(bar_of(k), Kv::copy_bytes(rows));
      Kv::copy_rows(slot_of(k), kv_head + block * stride_block, map, head, block, rows,
                    bar_of(k), page_l2_policy(k, kStages));
    }
  }
};

// The cache at kv head `kvh` (strides are in elements, as torch reports them).
template <class Kv>
__device__ __forceinline__ const uint8_t* kv_head_of(const DecodeParams& p, int kvh) {
  return static_cast<const uint8_t*>(p.kv_cache) + kvh * p.kv_stride_head * Kv::kElemBytes;
}

// What multiplies a kv head's logits as the fragments compute them (softmax
// scale x log2(e), x k_scale x 2^e for an fp8 cache: KvFp8::load_q) and its
// normalized output (v_scale).
struct HeadScales {
  float logits_log2;
  float out;
};

// The scales of kv head `kvh` before q is loaded: the logits' without fp8's
// 2^e (with_q_exponent adds it once q is in).
// NOTE: k_scale and v_scale are read after griddepcontrol.wait, as q (a
// captured graph may update them in a kernel ahead of this one), and ahead of
// q, whose fp8 conversion waits for its loads.
template <class Kv>
__device__ __forceinline__ HeadScales head_scales(const DecodeParams& p, int kvh) {
  if constexpr (Kv::kDtype == KvDtype::kBf16) {
    return {p.scale_log2, 1.f};
  } else {
    const float k_scale = p.k_scale ? ptx::ld_global_f32(p.k_scale + p.k_scale_stride * kvh) : 1.f;
    const float v_scale = p.v_scale ? ptx::ld_global_f32(p.v_scale + p.v_scale_stride * kvh) : 1.f;
    return {p.scale_log2 * k_scale, v_scale};
  }
}

template <class Kv>
__device__ __forceinline__ HeadScales with_q_exponent(HeadScales sc, int q_exp) {
  if constexpr (Kv::kDtype != KvDtype::kBf16) sc.logits_log2 *= exp2i(q_exp);
  return sc;
}

// One mbarrier per ring slot, each expecting one arrival (lane 0's expect_tx).
template <int kStages>
__device__ __forceinline__ void init_ring_barriers(ptx::Mbarrier* bars, int lane) {
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(bars[s], 1);
    ptx::fence_mbarrier_init();
  }
  __syncwarp();
}

// Issues the leading kStages - 1 pages that are (`current`) or are not the
// page holding the current token: the latter before griddepcontrol.wait, the
// former after it (the previous kernel writes that page's K/V).
template <class Kv, int kStages>
__device__ __forceinline__ void issue_leading_pages(const WarpPages<Kv, kStages>& w, int bt_cur,
                                                    int current_page, bool current, int lane) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int blk = __shfl_sync(kFullMask, bt_cur, s);
    if (s < w.n_pages && (w.first_page + s * w.step == current_page) == current)
      w.issue(s, blk, lane);
  }
}

// The pages a warp streams after these (kChain): the next pair of a
// persistent warp-per-head warp, its ring position going on from this pair's
// end, and lane i's block id of its page i (i < 32). n_pages 0: none.
template <class Kv, int kStages>
struct NextPages {
  WarpPages<Kv, kStages> pages;
  int bt;
};

// Streams all of the warp's pages through the online softmax (the leading
// ones already issued); returns with st.l summed over the warp's lanes.
// kChain: the slots this stream frees last take `next`'s leading pages, so
// the ring never drains between two pairs (needs w.n_pages >= kStages - 1).
template <class Kv, int kStages, bool kChain = false>
__device__ __forceinline__ void stream_pages(const WarpPages<Kv, kStages>& w, int bt_cur,
                                             int bt_next, const uint32_t (&q)[16], int start_tok,
                                             int seq_len, float scale_log2, int g, int t, int lane,
                                             WarpState& st,
                                             const NextPages<Kv, kStages>* next = nullptr,
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
        w.issue(kn, blk, lane);
      } else if constexpr (kChain) {
        // Ring position ring_base + kn is the next pages' page kn - n_pages.
        const int j = kn - w.n_pages;
        const int next_blk = __shfl_sync(kFullMask, next->bt, j & 31);
        if (j < kStages - 1 && j < next->pages.n_pages) next->pages.issue(j, next_blk, lane);
      }
    };
    // Refilled after the wait, the ring keeps one page fewer in flight: where
    // the grid streams enough warps, fewer bytes queue at HBM in front of
    // everyone's next page (see launch_plan.cpp).
    if (!refill_after_wait) refill();
    ptx::mbarrier_wait_parity(w.bar_of(k), w.parity_of(k));
    if (refill_after_wait) refill();
    const int page = w.first_page + k * w.step;
    uint32_t kf[32], vf[32];
    Kv::load_page(ptx::smem_addr(w.slot_of(k)), page, start_tok, seq_len, g, t, kf, vf);
    attend_page<Kv>(kf, vf, q, page, start_tok, seq_len, scale_log2, g, t, st);
  }
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    st.l[0] += __shfl_xor_sync(kFullMask, st.l[0], off);
    st.l[1] += __shfl_xor_sync(kFullMask, st.l[1], off);
  }
}

// Where a warp is in its prologue: the split kernels' testing build stamps the
// clock there (csrc/testing/split_phases.cu); the operator's kernels pass this
// one, or none (a null probe: the warp-per-head kernel), and compile to nothing.
struct NoPrologueProbe {
  __device__ __forceinline__ void leading_issued() {}
  __device__ __forceinline__ void waited() {}
};

// A warp's part of the call in the order PDL allows, the same in every kernel:
// the leading pages that do not depend on the previous kernel, then
// griddepcontrol.wait, then what the previous kernel writes (the page holding
// the current token, q, the fp8 scales), and all pages streamed. Returns the
// kv head's scales.
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
// `probe`, if any, is told when the leading pages are out and the wait is over.
template <class Kv, int kStages, bool kChain = false, class Probe = NoPrologueProbe>
__device__ __forceinline__ HeadScales wait_then_stream_pages(
    const DecodeParams& p, const WarpPages<Kv, kStages>& pages, int bt_cur, int bt_next, int b,
    int kvh, int start_tok, int seq_len, int g, int t, int lane, WarpState& st,
    bool leading_issued = false, const NextPages<Kv, kStages>* next = nullptr,
    Probe* probe = nullptr) {
  const int current_page = (seq_len - 1) / kPageTokens;
  if (!leading_issued) issue_leading_pages(pages, bt_cur, current_page, false, lane);
  if (probe) probe->leading_issued();
  ptx::grid_dependency_wait();
  if (probe) probe->waited();
  ptx::launch_dependents();
  // Refill::kAfterUnlessLate: a warp whose first page is still in flight here
  // entered late (its CTA found an SM only as the previous call ended) and
  // streams with the whole ring in flight, twice the share of the HBM queue
  // that the warps with one page in flight get, to catch up with them.
  bool refill_after_wait = p.refill == Refill::kAfterWait;
  if (p.refill == Refill::kAfterUnlessLate && pages.n_pages > 0) {
    const bool landed = ptx::mbarrier_test_parity(pages.bar_of(0), pages.parity_of(0));
    refill_after_wait = __shfl_sync(kFullMask, landed, 0);
  }
  if (!leading_issued) issue_leading_pages(pages, bt_cur, current_page, true, lane);
  const HeadScales unscaled = head_scales<Kv>(p, kvh);
  uint32_t q[16];
  const int q_exp = load_q<Kv>(p.q + b * p.q_stride_b + (kvh * kGqa + g) * p.q_stride_h, t, q);
  const HeadScales sc = with_q_exponent<Kv>(unscaled, q_exp);
  stream_pages<Kv, kStages, kChain>(pages, bt_cur, bt_next, q, start_tok, seq_len,
                                    sc.logits_log2, g, t, lane, st, next, refill_after_wait);
  return sc;
}

}  // namespace flint::detail
