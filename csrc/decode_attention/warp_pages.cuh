// One warp's page stream, shared by the decode kernels: the bulk copy of a
// page into a ring slot, the lane fragments of K and V, and one page of the
// online softmax on the tensor cores (S^T = K Q^T, O^T += V^T P^T, the 8
// query heads of the GQA group as the n = 8 dimension).
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/params.h"
#include "decode_attention/timeline.cuh"
#include "ptx/bulk_copy.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"
#include "ptx/mma.cuh"

namespace flint::detail {

// Online-softmax state of one warp for the two query heads 2t and 2t+1 of
// lane (g, t), and its share of O^T.
struct WarpState {
  float m[2];    // running max of the raw logits S (unscaled)
  float l[2];    // this lane's part of the row sums (tokens g and g+8 of each page)
  float o[32];   // O^T fragments of the 8 m-tiles of 16 dims, see store_warp_state
};

// Bulk-copies one page (block `block`, this kv head) into a ring slot.
__device__ __forceinline__ void issue_page(const uint16_t* kv_head, int64_t stride_block,
                                           int block, uint32_t slot, uint32_t bar, int lane) {
  if (lane == 0) {
    ptx::mbarrier_arrive_expect_tx(bar, kPageBytes);
    ptx::bulk_copy_g2s(slot, kv_head + block * stride_block, kPageBytes, bar);
  }
}

// Lane (g, t) fragments of one page:
//   k[16r + 4i + j] = K[token g + 8r][dims 32i + 8t + 2j, +1]          (r < 2, i < 4)
//   v[4(2r + h) + j] = V[token 2t + (r & 1) + 8(r >> 1)][dims v_chunk_dim(g, h) + 2j, +1]
// V rows outside [start_tok, seq_len) are zeroed, so stale or NaN cache
// contents never reach P V (a zero P alone would not cancel a NaN).
//
// Ring rows are 512 bytes apart, so every row starts at bank 0 and 16-byte
// column c of any row lies in bank group c % 8. Read in fragment order, a
// quarter-warp (the 8 lanes of one g pair) would take K as two rows x the same
// four columns (2-way conflict) and V as four rows x the same two columns
// (4-way): 192 wavefronts per page where 96 do. So the lanes of odd g read
// each pair of K column blocks (i = 2m, 2m + 1) in the other order, the lanes
// t >= 2 read their two V chunks in the other order, and V's second chunk is
// dims 64 + 8(g ^ 4) rather than 64 + 8g (O^T's dims follow, o_tile_dim): K is
// conflict-free, V 2-way, and a select per word puts each fragment back
// (device runs 73-74: swa128 b64 10.9 -> 9.9 us, b1 L32k 34.4 -> 34.0).
__device__ __forceinline__ int v_chunk_dim(int g, int h) {
  return 64 * h + 8 * (h == 1 ? g ^ 4 : g);
}

__device__ __forceinline__ void load_page(uint32_t slot, int page, int start_tok, int seq_len,
                                          int g, int t, uint32_t (&k)[32], uint32_t (&v)[32]) {
  const bool k_swap = g & 1;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t row = slot + (g + 8 * r) * kRowBytes + 16 * t;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      uint32_t a[4], b[4];  // column blocks 2m, 2m + 1 (swapped for odd g)
      ptx::ld_shared_u32x4(row + 128 * m + (k_swap ? 64 : 0), a);
      ptx::ld_shared_u32x4(row + 128 * m + (k_swap ? 0 : 64), b);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        k[16 * r + 8 * m + j] = k_swap ? b[j] : a[j];
        k[16 * r + 8 * m + 4 + j] = k_swap ? a[j] : b[j];
      }
    }
  }
  const bool v_swap = t >> 1;
  const uint32_t v_row0 = slot + kHeadDim * 2 + 2 * t * kRowBytes;
  const uint32_t chunk0 = v_chunk_dim(g, 0) * 2, chunk1 = v_chunk_dim(g, 1) * 2;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint32_t row = v_row0 + ((r & 1) + 8 * (r >> 1)) * kRowBytes;
    uint32_t a[4], b[4];  // chunks h = 0, 1 (swapped for t >= 2)
    ptx::ld_shared_u32x4(row + (v_swap ? chunk1 : chunk0), a);
    ptx::ld_shared_u32x4(row + (v_swap ? chunk0 : chunk1), b);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[8 * r + j] = v_swap ? b[j] : a[j];
      v[8 * r + 4 + j] = v_swap ? a[j] : b[j];
    }
  }
  const int first = page * kPageTokens;
  if (first < start_tok || first + kPageTokens > seq_len) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int pos = first + 2 * t + (r & 1) + 8 * (r >> 1);
      const bool attended = pos >= start_tok && pos < seq_len;
#pragma unroll
      for (int j = 0; j < 8; ++j) v[8 * r + j] = attended ? v[8 * r + j] : 0u;
    }
  }
}

// The dim of row g of m-tile j of O^T (row g + 8: the next dim): the first
// half of word j % 4 of V chunk j / 4 (load_page).
__device__ __forceinline__ int o_tile_dim(int j, int g) {
  return v_chunk_dim(g, j / 4) + 2 * (j % 4);
}

// One page of the online softmax: S^T = K Q^T, rescale, O^T += V^T P^T.
__device__ __forceinline__ void attend_page(const uint32_t (&k)[32], const uint32_t (&v)[32],
                                            const uint32_t (&q)[16], int page, int start_tok,
                                            int seq_len, float scale_log2, int g, int t,
                                            WarpState& st) {
  // S^T[token][head]: k-step c covers dims 32(c / 2) + 4(c % 2) + 8t + 0..3 of
  // every lane t; the same permutation of the 128 dims on both operands.
  // Two accumulators break the dependency chain of the 8 MMAs.
  float sa[4] = {0.f, 0.f, 0.f, 0.f};
  float sb[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const int i = c / 2, h = c % 2;
    const uint32_t a[4] = {k[4 * i + 2 * h], k[16 + 4 * i + 2 * h], k[4 * i + 2 * h + 1],
                           k[16 + 4 * i + 2 * h + 1]};
    ptx::mma_m16n8k16_bf16_f32(c % 2 == 0 ? sa : sb, a, q[4 * i + 2 * h], q[4 * i + 2 * h + 1]);
  }
  // s[0], s[1]: token g, heads 2t, 2t+1; s[2], s[3]: token g + 8.
  float s[4] = {sa[0] + sb[0], sa[1] + sb[1], sa[2] + sb[2], sa[3] + sb[3]};
  const int pos = page * kPageTokens + g;
  if (pos < start_tok || pos >= seq_len) s[0] = s[1] = neg_inf();
  if (pos + 8 < start_tok || pos + 8 >= seq_len) s[2] = s[3] = neg_inf();

  // Every page holds at least one attended token, so the new max is finite.
  float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    mx[0] = fmaxf(mx[0], __shfl_xor_sync(kFullMask, mx[0], off));
    mx[1] = fmaxf(mx[1], __shfl_xor_sync(kFullMask, mx[1], off));
  }
  float alpha[2], p[4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(st.m[h], mx[h]);
    const float m_scaled = m_new * scale_log2;
    alpha[h] = ptx::ex2(fmaf(st.m[h], scale_log2, -m_scaled));
    p[h] = ptx::ex2(fmaf(s[h], scale_log2, -m_scaled));
    p[h + 2] = ptx::ex2(fmaf(s[h + 2], scale_log2, -m_scaled));
    st.m[h] = m_new;
    st.l[h] = st.l[h] * alpha[h] + (p[h] + p[h + 2]);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    st.o[4 * j] *= alpha[0];
    st.o[4 * j + 1] *= alpha[1];
    st.o[4 * j + 2] *= alpha[0];
    st.o[4 * j + 3] *= alpha[1];
  }

  // P^T as the B operand: lane (g, t) needs P[tokens 2t, 2t+1 | 2t+8, 2t+9][head g],
  // held by lanes 8t + g/2 (token 2t) and 8t + g/2 + 4 (token 2t+1), in the
  // half g % 2 of their (head 2t', 2t'+1) pairs.
  const uint32_t x = ptx::pack_bf16x2(p[0], p[1]);
  const uint32_t y = ptx::pack_bf16x2(p[2], p[3]);
  const int src = 8 * t + (g >> 1);
  const uint32_t x0 = __shfl_sync(kFullMask, x, src), x1 = __shfl_sync(kFullMask, x, src + 4);
  const uint32_t y0 = __shfl_sync(kFullMask, y, src), y1 = __shfl_sync(kFullMask, y, src + 4);
  const uint32_t sel = (g & 1) ? 0x7632u : 0x5410u;
  const uint32_t b0 = ptx::prmt(x0, x1, sel), b1 = ptx::prmt(y0, y1, sel);

  // O^T[dim][head] += V^T P^T. m-tile j: rows g, g+8 are dims d0, d0+1 with
  // d0 = o_tile_dim(j, g), i.e. the two halves of word j % 4 of V chunk j / 4;
  // prmt pairs tokens (2t, 2t+1) and (2t+8, 2t+9) per dim.
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int hh = j / 4, wi = j % 4;
    const uint32_t va = v[4 * hh + wi], vb = v[4 * (2 + hh) + wi];
    const uint32_t vc = v[4 * (4 + hh) + wi], vd = v[4 * (6 + hh) + wi];
    const uint32_t a[4] = {ptx::prmt(va, vb, 0x5410u), ptx::prmt(va, vb, 0x7632u),
                           ptx::prmt(vc, vd, 0x5410u), ptx::prmt(vc, vd, 0x7632u)};
    float(&acc)[4] = *reinterpret_cast<float(*)[4]>(&st.o[4 * j]);
    ptx::mma_m16n8k16_bf16_f32(acc, a, b0, b1);
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

// Q^T as the B operand of S^T = K Q^T: lane (g, t) holds head g, dims
// 32i + 8t .. 32i + 8t + 7 in q[4i .. 4i + 3].
__device__ __forceinline__ void load_q_fragments(const uint16_t* q_row, int t, uint32_t (&q)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t v[4];
    ptx::ld_global_u32x4(q_row + 32 * i + 8 * t, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) q[4 * i + j] = v[j];
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
    // everyone's next page (see launch.cu).
    if (!refill_after_wait) refill();
    ptx::mbarrier_wait_parity(w.bar_of<kStages>(k), w.parity_of<kStages>(k));
    if (refill_after_wait) refill();
    const int page = w.first_page + k * w.step;
    uint32_t kf[32], vf[32];
    load_page(w.slot_of<kStages>(k), page, start_tok, seq_len, g, t, kf, vf);
    attend_page(kf, vf, q, page, start_tok, seq_len, scale_log2, g, t, st);
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
template <int kStages, bool kTimeline, bool kChain = false>
__device__ __forceinline__ void wait_then_stream_pages(const DecodeParams& p, const WarpPages& pages,
                                                       int bt_cur, int bt_next, int b, int kvh,
                                                       int start_tok, int seq_len, int g, int t,
                                                       int lane, WarpState& st,
                                                       bool leading_issued = false,
                                                       const NextPages* next = nullptr) {
  const int current_page = (seq_len - 1) / kPageTokens;
  if (!leading_issued) issue_leading_pages<kStages>(pages, bt_cur, current_page, false, lane);
  stamp<kTimeline>(p, kStampPrologue);
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  stamp<kTimeline>(p, kStampWaited);
  // refill_after_wait 2: a warp whose first page is still in flight here
  // entered late (its CTA found an SM only as the previous call ended) and
  // streams with the whole ring in flight, twice the share of the HBM queue
  // that the warps with one page in flight get, to catch up with them.
  bool refill_after_wait = p.refill_after_wait == 1;
  if (p.refill_after_wait == 2 && pages.n_pages > 0) {
    const bool landed = ptx::mbarrier_test_parity(pages.bar_of<kStages>(0),
                                                  pages.parity_of<kStages>(0));
    refill_after_wait = __shfl_sync(kFullMask, landed, 0);
  }
  if (!leading_issued) issue_leading_pages<kStages>(pages, bt_cur, current_page, true, lane);
  uint32_t q[16];
  load_q_fragments(p.q + b * p.q_stride_b + (kvh * kGqa + g) * p.q_stride_h, t, q);
  stream_pages<kStages, kChain>(pages, bt_cur, bt_next, q, start_tok, seq_len, p.scale_log2, g, t,
                                lane, st, next, refill_after_wait);
  stamp<kTimeline>(p, kStampStreamed);
}

}  // namespace flint::detail
