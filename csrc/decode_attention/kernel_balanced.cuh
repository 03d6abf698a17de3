// Paged decode attention, the work divided by pages on the device.
//
// The batch is one sequence of units: segment (b, h) -- request b, tile h, a
// row tile of a kv head (common.cuh) -- is u_b = c + n_b units, a piece's
// fixed cost c (division.h) and then one unit per attended page of request b (u_b = 0 without pages), segments in
// order b-major, so (b, h) starts at unit H U_b + h u_b with U_b =
// sum_{b' < b} u_b'. A persistent grid of one wave (launch_plan.cpp) gives
// each warp an equal share of that sequence, `per_warp` consecutive units, and
// each CTA the kWarps shares of its warps: the division depends only on the
// actual lengths, computed in every CTA from seq_lens (a prefix sum) at every
// call, so a captured CUDA graph stays balanced whatever the lengths.
//
// A warp streams its share as pieces (the part of one segment in its share)
// through one ring of page slots that goes on from piece to piece. A segment
// inside one warp's share is normalized and written by that warp. A segment
// split over warps is merged in shared memory by the CTA, and written if it
// lies inside the CTA; a segment split over CTAs goes through fp32 partials
// in the workspace: the last CTA to arrive merges them. More than
// kMaxFanIn partials are merged in two levels, groups of ~sqrt(F), so that no
// CTA reads more than ~sqrt(F) partials in a row.
#pragma once

#include <cstdint>

#include "decode_attention/common.cuh"
#include "decode_attention/hopper.h"
#include "decode_attention/kernels/registry.h"
#include "decode_attention/online_softmax.cuh"
#include "decode_attention/merge.cuh"
#include "decode_attention/numerics.h"
#include "decode_attention/page_ring.cuh"
#include "decode_attention/params.h"
#include "decode_attention/probes.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/memory.cuh"

namespace flint {

namespace detail {

// A warp's piece that it could not finish alone: which segment, where that
// segment lies in the batch's pages, and what finishing it needs (so that the
// merges read no global memory before their loads of partials).
struct PieceRecord {
  int b, h, n;         // segment (b, h) of n pages; b < 0: no record
  int seq_len;         // request b's (clamped: seq_extent)
  int64_t seg_begin;   // the unit of its first page in the batch's sequence
  float scale_log2;    // softmax scale x log2(e) (x k_scale)
  float v_scale;
  float sink_log2[kRowTile];  // sinks x log2(e)
};

// Where warp w of this CTA starts: request b, with units_before = U_b.
struct WarpStart {
  int b;
  int64_t units_before;
};

// What the division gives this CTA: its units [cta_begin, cta_end) of the
// batch's sequence, and the units of each warp's share (per_warp) and of each
// CTA's (cta_pages).
struct CtaUnits {
  int64_t per_warp, cta_pages, cta_begin, cta_end;
};

template <class Kv, int kWarps, int kStages>
struct BalancedSmem {
  WarpRing<Kv, kStages> ring[kWarps];
  WarpPartial<Kv> first[kWarps];  // a warp's first piece, when split and not its last
  ptx::Mbarrier bars[kWarps][kStages];
  PieceRecord pieces[kWarps][2];  // [w][0]: the partial in first[w]; [w][1]: in ring[w].last
  WarpStart starts[kWarps];
  int64_t warp_sums[2][kWarps];  // scan scratch (scan_block)
  int last_arrival[2];        // this CTA arrived last at the merge of its first / last segment
  // The division's result for the merges, read back after the stream so that
  // it does not hold 8 registers through it (the fp8 kernel is at 255).
  CtaUnits units;
};

// The pages of a segment in one warp's share.
struct Piece {
  int b, h;
  int off, count;  // pages off .. off + count - 1 of the segment; count 0: no piece
  SeqExtent e;     // request b's attended span (e.num_pages = n_b)
  int64_t seg_begin;  // the unit of its page 0 (page k at seg_begin + k)
};

// Partials of the cross-CTA merges: CTA c writes its part of the segment that
// starts in it (and continues past it) at slot 2c + 1, its part of a segment
// that began before it at slot 2c, so every slot has one writer. Level-1
// partials in rows [0, 2 grid), level-2 (group) partials in [2 grid, 4 grid);
// arrival counters likewise: groups' at [0, 2 grid), segments' at [2 grid, 4 grid).
__device__ __forceinline__ int partial_slot(int cta, int first_cta) {
  return 2 * cta + (cta == first_cta ? 1 : 0);
}

// Bytes one SM keeps in flight to take in its share of HBM bandwidth through
// bulk copies (8 warps with one 8 KB page each in flight took in ~66 GB/s per
// SM, short of its share).
constexpr int kSmIntakeInFlight = 64 * 1024;

// A block of kPer x 32 kWarps requests from `base`: thread tid's kPer
// consecutive ones' units n[] (segment_units), the units of the block's
// requests before them (excl) and the block's total. One round of loads and one
// barrier; `sums` alternates between two halves so that the next block's
// scan need not wait for this one's readers.
template <int kPer>
struct RequestBlock {
  int n[kPer];
  int64_t excl, total;
};

template <int kWarps, int kPer>
__device__ __forceinline__ RequestBlock<kPer> scan_block(const DecodeParams& p, int piece_cost,
                                                         int base, int64_t (&sums)[2][kWarps],
                                                         int parity, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  RequestBlock<kPer> r;
  int64_t mine = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int b = base + kPer * tid + i;
    r.n[i] = b < p.batch ? segment_units(seq_extent(p, p.seq_lens[b]).num_pages, piece_cost) : 0;
    mine += r.n[i];
  }
  const int64_t incl = warp_inclusive_sum(mine, lane);
  if (lane == 31) sums[parity][warp] = incl;
  __syncthreads();
  r.excl = incl - mine;
  r.total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    r.excl += w < warp ? sums[parity][w] : 0;
    r.total += sums[parity][w];
  }
  return r;
}

// out = v_scale O / (l + 2^(sink log2(e) - m c)) for column eh of segment r
// (and its lse), where the column has a query row.
template <int E>
__device__ __forceinline__ void finish(const DecodeParams& p, const PieceRecord& r,
                                       const float (&o)[E], float m, float l, int eh, int ed) {
  const Column col = column_of(p, r.h, eh);
  uint16_t* const row = out_row_of(p, r.b, col);
  if (row == nullptr) return;
  const float m_scaled = m * r.scale_log2;
  store_out<E>(row + ed, o,
               normalize_with_sink(r.v_scale, l, r.sink_log2[eh], m_scaled,
                                   column_end(p, r.seq_len, col) > 0));
  if (ed == 0) store_lse(p, r.b, col, l, r.sink_log2[eh], m_scaled);
}

// Who a thread is: its warp and lane (g = lane / 4, t = lane % 4), the dims
// [ed, ed + E) of head eh it owns in the merges, and the CTA's place in the
// grid (H: the tiles of a request, each request's segments).
struct Place {
  int tid, warp, lane, g, t, eh, ed, H, cta, grid;
};

// ---- step 1: the division, every CTA computing it from seq_lens ----------------
// NOTE: seq_lens and block tables are read before griddepcontrol.wait: they
// are written by host-to-device copies ahead of the forward, never by the
// kernel this one overlaps with (README, programmatic dependent launch).
// Thread tid takes requests kPer tid .. kPer tid + kPer - 1 of each block of
// kPer kThreads: a batch of up to 4 kThreads is one round of loads and one
// scan; a larger one takes a pass for the total and another for the starts.
// Each warp's first request goes to sm.starts (read after the __syncthreads
// that ends this step).
template <class Kv, int kWarps, int kStages>
__device__ __forceinline__ CtaUnits divide_batch(const DecodeParams& p,
                                                 BalancedSmem<Kv, kWarps, kStages>& sm,
                                                 const Place& at) {
  constexpr int kThreads = 32 * kWarps;
  const int tid = at.tid, warp = at.warp, lane = at.lane, H = at.H, cta = at.cta, grid = at.grid;
  constexpr int kPer = 4, kBlock = kPer * kThreads;
  if (lane == 0) {
    sm.pieces[warp][0].b = sm.pieces[warp][1].b = -1;
    sm.starts[warp].b = -1;
  }
  constexpr int kCost = piece_cost_units(Kv::kDtype);
  RequestBlock<kPer> blk = scan_block<kWarps, kPer>(p, kCost, 0, sm.warp_sums, 0, tid);
  int64_t batch_units = blk.total;
  int parity = 1;
  for (int base = kBlock; base < p.batch; base += kBlock, parity ^= 1)
    batch_units += scan_block<kWarps, kPer>(p, kCost, base, sm.warp_sums, parity, tid).total;
  const Division div = divide_pages(batch_units * H, grid, kWarps, kStages - 1);
  const int64_t total = div.total, per_warp = div.per_warp, cta_pages = div.cta_pages;
  const int64_t cta_begin = min(cta * cta_pages, total), cta_end = min(cta_begin + cta_pages, total);

  // Each warp's first request: the one whose segments hold unit
  // cta_begin + w per_warp, from the exclusive prefix sum over the requests
  // (stopping once past this CTA's units; the first block's scan is reused).
  int64_t before = 0;  // units of the requests ahead of this block of them
  for (int base = 0; cta_begin < cta_end && base < p.batch && before * H < cta_end;
       base += kBlock) {
    if (base > 0) {
      blk = scan_block<kWarps, kPer>(p, kCost, base, sm.warp_sums, parity, tid);
      parity ^= 1;
    }
    int64_t excl = before + blk.excl;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (blk.n[i] > 0) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const int64_t x = cta_begin + w * per_warp;
          if (x < cta_end && x >= H * excl && x < H * (excl + blk.n[i]))
            sm.starts[w] = {base + kPer * tid + i, excl};
        }
      }
      excl += blk.n[i];
    }
    before += blk.total;
  }
  __syncthreads();
  return {per_warp, cta_pages, cta_begin, cta_end};
}

// A warp's first piece: the pages of the segment holding unit x0 from x0 on
// (from page 0 where x0 is one of the segment's first kCost units); none
// where the share [x0, x1) is empty.
__device__ __forceinline__ Piece first_piece(const DecodeParams& p, const WarpStart& s, int64_t x0,
                                             int64_t x1, int H, int kCost) {
  Piece cur{};
  if (x0 < x1) {
    cur.b = s.b;
    cur.e = seq_extent(p, p.seq_lens[s.b]);
    const int units = cur.e.num_pages + kCost;
    const int64_t into = x0 - H * s.units_before;
    cur.h = static_cast<int>(into / units);
    cur.seg_begin = x0 - into % units + kCost;
    const int64_t from = max(x0, cur.seg_begin);
    cur.off = static_cast<int>(from - cur.seg_begin);
    cur.count = static_cast<int>(
        max(min(cur.seg_begin + cur.e.num_pages, x1) - from, int64_t(0)));
  }
  return cur;
}

// A segment's k_scale, v_scale, the sinks of lane (g, t)'s columns 2t, 2t + 1
// and its q words.
template <class Kv>
struct SegmentInputs {
  float k_scale, v_scale, sink0, sink1;
  uint32_t q[Kv::kQWords];
};

// NOTE: loaded only past griddepcontrol.wait (q is the previous kernel's
// output); ld_global is ordered with the ring's copies and waits.
template <class Kv>
__device__ __forceinline__ void load_inputs(const DecodeParams& p, const Piece& c, int g, int t,
                                            SegmentInputs<Kv>& in) {
  const int kvh = kv_head_of_tile(p, c.h);
  in.k_scale = p.k_scale ? ptx::ld_global_f32(p.k_scale + p.k_scale_stride * kvh) : 1.f;
  in.v_scale = p.v_scale ? ptx::ld_global_f32(p.v_scale + p.v_scale_stride * kvh) : 1.f;
  const bool sinks = p.sinks != nullptr;
  const Column col0 = column_of(p, c.h, 2 * t), col1 = column_of(p, c.h, 2 * t + 1);
  in.sink0 = sinks && col0.token >= 0 ? ptx::ld_global_f32(p.sinks + col0.head) : neg_inf();
  in.sink1 = sinks && col1.token >= 0 ? ptx::ld_global_f32(p.sinks + col1.head) : neg_inf();
  load_q_words_or_zeros<Kv>(q_row_of(p, c.b, column_of(p, c.h, g)), t, in.q);
}

// The prologue's probe points as the balanced kernel's phases.
template <class Probe>
struct BalancedPrologueProbe {
  Probe& probe;
  __device__ __forceinline__ void leading_issued() { probe.at(kLeadingIssued); }
  __device__ __forceinline__ void waited() { probe.at(kWaited); }
};

// ---- step 2: a warp streams its share ----------------------------------------
// The share [x0, x1) as pieces through one ring: a whole segment is
// normalized and stored here, a part of one becomes a partial for the CTA
// merge (the first piece in sm.first[warp], the last in the ring's own
// memory, free by then) with its record in sm.pieces[warp].
template <class Kv, int kWarps, int kStages, class Probe>
__device__ __forceinline__ void stream_share(const DecodeParams& p,
                                             BalancedSmem<Kv, kWarps, kStages>& sm,
                                             const CtaUnits& u, const Place& at, Probe& probe) {
  const int warp = at.warp, lane = at.lane, g = at.g, t = at.t, H = at.H;
  constexpr int kCost = piece_cost_units(Kv::kDtype);
  const int64_t per_warp = u.per_warp;
  const int64_t x0 = u.cta_begin + warp * per_warp, x1 = min(x0 + per_warp, u.cta_end);
  const uint8_t* kv = static_cast<const uint8_t*>(p.kv_cache);
  const int64_t stride_block = p.kv_stride_block * Kv::kElemBytes;
  const int64_t stride_head = p.kv_stride_head * Kv::kElemBytes;
  auto span_of = [&](const Piece& c, int ring_base) {
    return PageSpan{p.block_tables + c.b * p.bt_stride_b + c.e.start_page + c.off,
                    kv + kv_head_of_tile(p, c.h) * stride_head, stride_block, &p.kv_map,
                    kv_head_of_tile(p, c.h), p.num_blocks,
                    c.e.start_page + c.off, c.count, ring_base, c.e.start_tok, c.e.seq_len, 1};
  };
  // The piece after `c` in this share, if any: the next segment's pages
  // (the next tile, or the next request with pages) before x1.
  auto next_piece = [&](const Piece& c) {
    Piece n = c;
    n.off = 0;
    n.count = 0;
    if (c.seg_begin + c.off + c.count >= x1) return n;
    n.seg_begin = c.seg_begin + c.e.num_pages + kCost;
    if (++n.h == H) {
      n.h = 0;
      do {
        ++n.b;
        n.e = seq_extent(p, p.seq_lens[n.b]);
      } while (n.e.num_pages <= 0 && n.b + 1 < p.batch);
    }
    n.count = static_cast<int>(max(min(int64_t(n.e.num_pages), x1 - n.seg_begin), int64_t(0)));
    return n;
  };
  Piece cur = first_piece(p, sm.starts[warp], x0, x1, H, kCost);

  const Ring<Kv, kStages> ring{sm.ring[warp].slots[0], sm.bars[warp]};
  ring.init(lane);
  PageSpan span = span_of(cur, 0);
  BlockIds ids = BlockIds::first(span, lane);

  // ---- prefetch, wait on the previous kernel --------------------------------
  BalancedPrologueProbe<Probe> prologue_probe{probe};
  pdl_prologue(ring, span, ids.cur, first_new_page(p, cur.e.seq_len), false, lane,
               &prologue_probe, [] {});

  // ---- the producer: the ring's next position and the page it takes ---------
  // The share's pages are one sequence of ring positions whatever pieces they
  // fall in: position n + kStages - 1 is issued once position n - 1 (its
  // slot) is consumed, before the step that consumes n (stream_piece's
  // fill_to), so a run of short pieces keeps the ring as full as one long
  // piece. Its block ids (`ids`) come 32 pages at a time per piece; moving
  // onto a piece loads them, used at the next issue (a consumed page later).
  Piece prod = cur;
  PageSpan prod_span = span;
  int prod_k = min(cur.count, kStages - 1);  // the prologue issued pages 0 .. prod_k - 1
  auto prod_enter_next = [&] {
    prod = next_piece(prod);
    prod_span = span_of(prod, prod_span.ring_base + prod_span.count);
    prod_k = 0;
    ids = BlockIds::first(prod_span, lane);
  };
  // Issues the ring positions before `end`, or up to the share's last.
  // NOTE: the caller's __syncwarp orders every lane's reads of the slots first.
  auto fill_to = [&](int end) {
    while (prod.count > 0 && prod_span.ring_base + prod_k < end) {
      const int block = ids.of(prod_k);
      probe.lap(kRefillSync);
      issue_page(ring, prod_span, prod_k, block, lane, probe);
      if (++prod_k == prod.count) {
        prod_enter_next();
      } else {
        ids.advance(prod_span, prod_k, lane);
      }
    }
  };
  if (prod.count > 0 && prod_k == prod.count) prod_enter_next();
  // A first piece shorter than kStages - 1 pages: the next pieces' fill the rest.
  fill_to(kStages - 1);

  // ---- stream the pieces ---------------------------------------------------
  // Refilled after the wait, a ring keeps one page fewer in flight (a shorter
  // HBM queue, lower latency for every page): where the CTA's warps still
  // keep what one SM's bulk-copy intake needs that way, and their shares are
  // longer than a ring (shorter ones put all their pages in flight at once).
  // A plan may force either (Refill::kBeforeWait / kAfterWait).
  constexpr int kInFlightAfterWait = kWarps * (kStages - 1) * Kv::kPageBytes;
  const bool refill_after_wait =
      p.refill != Refill::kKernelRule
          ? p.refill == Refill::kAfterWait
          : per_warp > kStages && kInFlightAfterWait >= kSmIntakeInFlight;
  // A segment's inputs are loaded one piece ahead (the next piece's while
  // this one streams), so that a short piece does not wait an L2 round trip
  // for them.
  SegmentInputs<Kv> ahead;
  if (cur.count > 0) load_inputs<Kv>(p, cur, g, t, ahead);
  probe.lap(kPieceSetup);
  while (cur.count > 0) {
    const Piece nxt = next_piece(cur);

    const SegmentInputs<Kv> in = ahead;
    if (nxt.count > 0) load_inputs<Kv>(p, nxt, g, t, ahead);
    const float v_scale = in.v_scale;
    const float sink0 = in.sink0 * kLog2eF, sink1 = in.sink1 * kLog2eF;
    uint32_t q[Kv::kQWords];
    const int q_exp = Kv::prepare_q(in.q, q);
    const float scale_log2 = p.scale_log2 * in.k_scale * exp2i(q_exp);

    WarpState<Kv> st;
    probe.lap(kPieceSetup);
    stream_piece(ring, span, fill_to, q, column_spans(p, cur.e.seq_len, cur.h, t), scale_log2, g,
                 t, refill_after_wait, st, probe);

    if (cur.off == 0 && cur.count == cur.e.num_pages) {
      // ---- a whole segment: normalize with the sink term and store --------
      const Column col0 = column_of(p, cur.h, 2 * t), col1 = column_of(p, cur.h, 2 * t + 1);
      const float inv0 = normalize_with_sink(v_scale, st.l[0], sink0, st.m[0] * scale_log2,
                                             column_end(p, cur.e.seq_len, col0) > 0);
      const float inv1 = normalize_with_sink(v_scale, st.l[1], sink1, st.m[1] * scale_log2,
                                             column_end(p, cur.e.seq_len, col1) > 0);
      store_warp_out<Kv>(out_row_of(p, cur.b, col0), out_row_of(p, cur.b, col1), st.o, inv0, inv1,
                         g, t);
      if (g == 0) {
        store_lse(p, cur.b, col0, st.l[0], sink0, st.m[0] * scale_log2);
        store_lse(p, cur.b, col1, st.l[1], sink1, st.m[1] * scale_log2);
      }
    } else {
      // ---- part of a segment: a partial for the CTA merge -----------------
      // The warp's last piece goes to its ring, free now (every page it
      // issued has been consumed); a first piece that is not the last, to
      // first[warp].
      const bool last = nxt.count == 0;
      __syncwarp();  // every lane is done reading the ring
      store_partial<Kv>(last ? sm.ring[warp].last : sm.first[warp], st, g, t);
      PieceRecord& r = sm.pieces[warp][last ? 1 : 0];
      if (lane == 0) {
        r.b = cur.b;
        r.h = cur.h;
        r.n = cur.e.num_pages;
        r.seq_len = cur.e.seq_len;
        r.seg_begin = cur.seg_begin;
        r.scale_log2 = scale_log2;
        r.v_scale = v_scale;
      }
      if (g == 0) {
        r.sink_log2[2 * t] = sink0;
        r.sink_log2[2 * t + 1] = sink1;
      }
    }

    span = span_of(nxt, span.ring_base + cur.count);
    cur = nxt;
    probe.lap(kPieceEnd);
  }
}

// seq_len-0 requests have no pages: CTA c zeroes requests c, c + grid, ...
// (while the CTA's slowest warp may still stream, not on the way to the
// first page), and gives their lse the sinks.
template <class Kv, int kThreads>
__device__ __forceinline__ void zero_empty_requests(const DecodeParams& p, const Place& at) {
  constexpr int kChunks = Kv::kHeadDim / 8;  // 16-byte stores a row
  static_assert(kThreads % kChunks == 0, "a thread's chunk is the same in every column");
  const int tid = at.tid, columns = at.H * kRowTile;
  for (int b = at.cta; b < p.batch; b += at.grid) {
    if (seq_extent(p, p.seq_lens[b]).num_pages > 0) continue;
    // Thread tid stores chunk tid % kChunks of every (kThreads / kChunks)-th column.
    for (int c = tid / kChunks; c < columns; c += kThreads / kChunks) {
      uint16_t* const row = out_row_of(p, b, column_of(p, c / kRowTile, c % kRowTile));
      if (row != nullptr) ptx::st_global_u32x4(row + (tid % kChunks) * 8, 0u, 0u, 0u, 0u);
    }
    if (p.lse != nullptr) {
      for (int c = tid; c < columns; c += kThreads) {
        const Column col = column_of(p, c / kRowTile, c % kRowTile);
        store_lse(p, b, col, 0.f, sink_log2_of(p, col), neg_inf());
      }
    }
  }
}

// The slots holding this CTA's first / last segment where it crosses a CTA
// boundary (-1: it does not).
struct CrossSlots {
  int first, last;
};

// ---- step 3: merge the pieces split over this CTA's warps -----------------------
// Slot i = (warp i / 2, first / last) in order; the slots of one segment
// are consecutive (empty ones between them aside). A segment inside the
// CTA is finished here; one that crosses a CTA boundary (at most the
// first and the last) becomes a workspace partial. Every slot's record
// and this thread's part of its partial are loaded at once (no load waits
// on another), then merged online in slot order, flushed where the
// segment changes. Thread tid owns dims [ed, ed + E) of head eh.
template <class Kv, int kWarps, int kStages, int E>
__device__ __forceinline__ CrossSlots merge_cta(const DecodeParams& p,
                                                BalancedSmem<Kv, kWarps, kStages>& sm,
                                                const CtaUnits& u, const Place& at) {
  const int eh = at.eh, ed = at.ed, cta = at.cta;
  constexpr int kSlots = 2 * kWarps;
  auto record = [&](int i) -> const PieceRecord& { return sm.pieces[i / 2][i % 2]; };
  auto partial = [&](int i) -> const WarpPartial<Kv>& {
    return i % 2 ? sm.ring[i / 2].last : sm.first[i / 2];
  };
  int slot_b[kSlots], slot_h[kSlots];
  float slot_m[kSlots], slot_l[kSlots], slot_c[kSlots];
  float4 slot_o[kSlots][E / 4];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    slot_b[i] = record(i).b;
    slot_h[i] = record(i).h;
    slot_c[i] = record(i).scale_log2;
    slot_m[i] = partial(i).m[eh];
    slot_l[i] = partial(i).l[eh];
#pragma unroll
    for (int e = 0; e < E / 4; ++e) slot_o[i][e] = partial_o4<Kv>(partial(i), eh, ed + 4 * e);
  }
  CrossSlots cross{-1, -1};  // scalars, not an array: registers
  int seg = -1, seg_b = 0, seg_h = 0;  // the first slot of the segment being merged, its (b, h)
  float m = neg_inf(), l = 0.f, o[E] = {};
  auto flush = [&] {
    const PieceRecord& r = record(seg);
    const bool starts_here = r.seg_begin >= u.cta_begin;
    if (starts_here && r.seg_begin + r.n <= u.cta_end) {
      finish<E>(p, r, o, m, l, eh, ed);
    } else {
      store_global_partial<E>(p, partial_slot(cta, starts_here ? cta : -1), o, m, l, eh, ed);
      (starts_here ? cross.last : cross.first) = seg;
    }
    m = neg_inf();
    l = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = 0.f;
  };
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (slot_b[i] < 0) continue;
    if (seg >= 0 && (slot_b[i] != seg_b || slot_h[i] != seg_h)) {
      flush();
      seg = -1;
    }
    if (seg < 0) {
      seg = i;
      seg_b = slot_b[i];
      seg_h = slot_h[i];
    }
    const float m_new = fmaxf(m, slot_m[i]);
    const float shift = softmax_shift(m_new * slot_c[i]);
    const float c_run = rescale(m, slot_c[i], shift), c_new = rescale(slot_m[i], slot_c[i], shift);
    l = l * c_run + slot_l[i] * c_new;
#pragma unroll
    for (int e = 0; e < E / 4; ++e) {
      o[4 * e] = o[4 * e] * c_run + slot_o[i][e].x * c_new;
      o[4 * e + 1] = o[4 * e + 1] * c_run + slot_o[i][e].y * c_new;
      o[4 * e + 2] = o[4 * e + 2] * c_run + slot_o[i][e].z * c_new;
      o[4 * e + 3] = o[4 * e + 3] * c_run + slot_o[i][e].w * c_new;
    }
    m = m_new;
  }
  if (seg >= 0) flush();
  return cross;
}

// ---- step 4: merge the segments split over CTAs ---------------------------------
// The last CTA to arrive at a segment's counter merges its workspace
// partials; past kMaxFanIn of them, in two levels (groups of ceil(sqrt(F))).
// NOTE: __syncthreads orders every thread's partial stores before the
// arriving thread's release (atom.acq_rel.gpu); after the next one, its
// acquire orders the merging threads' loads (ld.global.cg, never a stale L1
// line) after the other CTAs' stores.
template <class Kv, int kWarps, int kStages, int E, class Probe>
__device__ __forceinline__ void merge_across_ctas(const DecodeParams& p,
                                                  BalancedSmem<Kv, kWarps, kStages>& sm,
                                                  const CtaUnits& u, CrossSlots cross,
                                                  const Place& at, Probe& probe) {
  const int tid = at.tid, warp = at.warp, lane = at.lane, eh = at.eh, ed = at.ed;
  const int cta = at.cta, grid = at.grid;
  const int64_t cta_pages = u.cta_pages;
  auto record = [&](int i) -> const PieceRecord& { return sm.pieces[i / 2][i % 2]; };
  auto first_cta = [&](const PieceRecord& r) { return static_cast<int>(r.seg_begin / cta_pages); };
  auto num_ctas = [&](const PieceRecord& r) {
    return static_cast<int>((r.seg_begin + r.n - 1) / cta_pages) - first_cta(r) + 1;
  };
  // The arrival counter this CTA counts at for segment r (level 1: its group's).
  auto counter = [&](const PieceRecord& r, int& arrivals) {
    const int c0 = first_cta(r), f = num_ctas(r);
    if (f <= MergeShape<E>::kMaxFanIn) {
      arrivals = f;
      return p.counters + 2 * grid + partial_slot(c0, c0);
    }
    const int group = ceil_sqrt(f), leader = c0 + (cta - c0) / group * group;
    arrivals = min(group, c0 + f - leader);
    return p.counters + partial_slot(leader, c0);
  };
  __syncthreads();
  const int mine = warp == 0 ? cross.first : cross.last;
  if (lane == 0 && warp < 2 && mine >= 0) {
    int arrivals = 0;
    int* c = counter(record(mine), arrivals);
    const bool last = ptx::atomic_add_acq_rel_gpu(c, 1) == arrivals - 1;
    if (last) ptx::st_relaxed_gpu(c, 0);  // resets itself for the next launch
    sm.last_arrival[warp] = last;
  }
  __syncthreads();
  probe.at(kArrived);
  bool finished = false;  // (the probe's only)
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int slot = k == 0 ? cross.first : cross.last;
    if (slot < 0 || !sm.last_arrival[k]) continue;
    const PieceRecord& r = record(slot);
    const int c0 = first_cta(r), f = num_ctas(r);
    float o[E], m, l;
    if (f <= MergeShape<E>::kMaxFanIn) {
      merge_global<E>(p, 0, f, [&](int i) { return partial_slot(c0 + i, c0); }, eh, ed,
                      r.scale_log2, o, m, l);
      finish<E>(p, r, o, m, l, eh, ed);
      finished = true;
      continue;
    }
    // Level 1 done by this group's last CTA: its group's partial, then the
    // segment's arrival over the groups.
    const int group = ceil_sqrt(f), leader = c0 + (cta - c0) / group * group;
    const int groups = (f + group - 1) / group;
    merge_global<E>(p, 0, min(group, c0 + f - leader),
                    [&](int i) { return partial_slot(leader + i, c0); }, eh, ed, r.scale_log2, o,
                    m, l);
    store_global_partial<E>(p, 2 * grid + partial_slot(leader, c0), o, m, l, eh, ed);
    __syncthreads();
    if (tid == 0) {
      int* c = p.counters + 2 * grid + partial_slot(c0, c0);
      const bool last = ptx::atomic_add_acq_rel_gpu(c, 1) == groups - 1;
      if (last) ptx::st_relaxed_gpu(c, 0);
      sm.last_arrival[k] = last;
    }
    __syncthreads();
    if (!sm.last_arrival[k]) continue;
    merge_global<E>(p, 2 * grid, groups, [&](int i) { return partial_slot(c0 + i * group, c0); },
                    eh, ed, r.scale_log2, o, m, l);
    finish<E>(p, r, o, m, l, eh, ed);
    finished = true;
  }
  if (finished) probe.at(kFinished);
}

}  // namespace detail

// The kernel's body (decode_attention_balanced_kernel below), with its probe:
// the division, each warp's share streamed, the CTA's merge, the merge across
// CTAs.
template <class Kv, int kWarps, int kStages, class Probe>
__device__ __forceinline__ void balanced_attention(const DecodeParams& p, Probe& probe) {
  using namespace detail;
  using Smem = BalancedSmem<Kv, kWarps, kStages>;
  static_assert(sizeof(Smem) <= hopper::kMaxSmemPerCta, "fits one CTA's shared memory");
  constexpr int kThreads = 32 * kWarps;
  // Epilogue mapping: thread tid owns E consecutive dims [ed, ed + E) of head eh.
  constexpr int E = kRowTile * Kv::kHeadDim / kThreads;
  constexpr int kThreadsPerHead = Kv::kHeadDim / E;
  static_assert(E == 4 || E == 8, "4 or 8 warps");

  extern __shared__ __align__(1024) uint8_t smem_raw[];  // fp8 ring slots: KvFp8::kSlotAlign
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int eh = tid / kThreadsPerHead, ed = (tid % kThreadsPerHead) * E;
  const Place at{tid, warp, lane, g, t, eh, ed, p.tiles, int(blockIdx.x), int(gridDim.x)};
  if (tid == 0) Kv::prefetch_map(&p.kv_map);
  probe.at(kEntered);

  {
    const CtaUnits u = divide_batch(p, sm, at);
    if (tid == 0) sm.units = u;
    probe.at(kDivided);
    stream_share(p, sm, u, at, probe);
    probe.at(kStreamed);
  }

  zero_empty_requests<Kv, kThreads>(p, at);
  __syncthreads();
  probe.at(kCtaReady);

  const CtaUnits u = sm.units;
  const CrossSlots cross = merge_cta<Kv, kWarps, kStages, E>(p, sm, u, at);
  probe.at(kCtaMerged);
  if (cross.first < 0 && cross.last < 0) return;

  merge_across_ctas<Kv, kWarps, kStages, E>(p, sm, u, cross, at, probe);
}

template <class Kv, int kWarps, int kStages>
__global__ void __launch_bounds__(32 * kWarps, 1)
    decode_attention_balanced_kernel(const __grid_constant__ DecodeParams p) {
  NoProbe probe;
  balanced_attention<Kv, kWarps, kStages>(p, probe);
}

template <class Kv, int kWarps, int kStages>
KernelEntry balanced_entry() {
  return {reinterpret_cast<const void*>(&decode_attention_balanced_kernel<Kv, kWarps, kStages>),
          static_cast<int>(sizeof(detail::BalancedSmem<Kv, kWarps, kStages>))};
}

}  // namespace flint
