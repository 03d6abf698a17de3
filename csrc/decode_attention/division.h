// The batch's attended pages and how the kernels divide them: the balanced
// kernel among its warps, the split kernels among their CTAs. Host and device
// share these formulas (the kernels compute the division on the device at
// every call; tests and benchmarks read it on the host through the testing
// extension).
#pragma once

#include <cstdint>

#include "decode_attention/params.h"

#if defined(__CUDACC__)
#define FLINT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLINT_HOST_DEVICE inline
#endif

namespace flint {

// One request's attended span, the union of its query tokens' spans: tokens
// [start_tok, seq_len), pages start_page + k for k < num_pages (num_pages <=
// 0: nothing to attend). Its first query token sits at seq_len - q_tokens
// and its window reaches back to start_tok. An out-of-contract length is
// clamped so that no read leaves the block table or the cache.
struct SeqExtent {
  int seq_len, start_tok, start_page, num_pages;
};

FLINT_HOST_DEVICE SeqExtent seq_extent(int raw_len, int window, int q_tokens, int max_blocks) {
  SeqExtent e;
  const int max_len = max_blocks * kPageTokens;
  e.seq_len = raw_len < 0 ? 0 : raw_len > max_len ? max_len : raw_len;
  const int first_end = e.seq_len - q_tokens + 1;  // the first query token's span's end
  e.start_tok = window > 0 && first_end > window ? first_end - window : 0;
  e.start_page = e.start_tok / kPageTokens;
  e.num_pages = (e.seq_len + kPageTokens - 1) / kPageTokens - e.start_page;
  return e;
}

FLINT_HOST_DEVICE SeqExtent seq_extent(const DecodeParams& p, int raw_len) {
  return seq_extent(raw_len, p.window, p.q_tokens, p.max_blocks);
}

// The division counts in units: segment (b, h) -- request b, kv head h --
// is piece_cost units, then one unit per page. A warp's piece of a segment
// has a fixed cost besides its pages (q and the scales in, the output or
// partial out): about one page's time with an fp8 page, while with a bf16 one
// it hides under the wait for HBM (a bf16 warp waits on its pages, not on its
// own work), so a warp whose share holds many short segments gets fewer pages.
constexpr FLINT_HOST_DEVICE int piece_cost_units(KvDtype kv) { return kv == KvDtype::kBf16 ? 0 : 1; }

// A request's units per kv head (none for a request with nothing to attend).
FLINT_HOST_DEVICE int segment_units(int num_pages, int piece_cost) {
  return num_pages > 0 ? num_pages + piece_cost : 0;
}

// Each warp of the grid gets per_warp consecutive units of the batch's
// `total`, each CTA the cta_pages units of its warps: CTA c holds units
// [c cta_pages, (c + 1) cta_pages) (clipped to total). per_warp is at least
// `min_per_warp`: a warp's first pages go out together before the wait, so
// shares shorter than that would only spread a small call over more CTAs
// (and split its segments over more of them).
struct Division {
  int64_t total, per_warp, cta_pages;
};

FLINT_HOST_DEVICE Division divide_pages(int64_t total, int ctas, int warps, int min_per_warp) {
  const int64_t all_warps = int64_t(ctas) * warps;
  int64_t per_warp = (total + all_warps - 1) / all_warps;
  if (per_warp < min_per_warp) per_warp = min_per_warp;
  return {total, per_warp, per_warp * warps};
}

// ---- the split kernels' division (kernel_split.cuh) ------------------------------
//
// A kv head's CTAs are divided among its requests by their attended pages:
// request b gets one CTA and `spare` x its share of the pages (rounded down),
// spare being the CTAs past one a request (cta_share).
FLINT_HOST_DEVICE int request_ctas(int64_t spare, int pages, int total_pages) {
  return 1 + (total_pages > 0 ? int(spare * pages / total_pages) : 0);
}

// The fewest splits of `warps` warps that give each warp the same largest
// number of the `pages`, at most `cap` and each warp at least min_pages.
FLINT_HOST_DEVICE int fewest_splits(int pages, int warps, int cap, int min_pages) {
  const int wanted = (pages + warps * min_pages - 1) / (warps * min_pages);
  const int splits = cap < wanted ? cap : wanted;
  const int pages_per_warp = (pages + splits * warps - 1) / (splits * warps);
  return (pages + pages_per_warp * warps - 1) / (pages_per_warp * warps);
}

// A request's active splits and the warps of each that stream: the fewest
// splits of all `warps`, or of the first merge_warps where that is as few
// (the other warps would only add pages in flight).
struct SplitStreams {
  int splits, warps;
};
FLINT_HOST_DEVICE SplitStreams split_streams(int pages, int warps, int merge_warps, int cap,
                                             int min_pages) {
  SplitStreams s{fewest_splits(pages, warps, cap, min_pages), warps};
  if (warps > merge_warps) {
    const int merge_warp_splits = fewest_splits(pages, merge_warps, cap, min_pages);
    if (merge_warp_splits <= s.splits) s = {merge_warp_splits, merge_warps};
  }
  return s;
}

// Pages of warp gw of the warps_total warps that interleave a request's
// num_pages pages (page k goes to warp k mod warps_total).
FLINT_HOST_DEVICE int interleaved_pages(int num_pages, int gw, int warps_total) {
  const int left = num_pages - gw > 0 ? num_pages - gw : 0;
  return (left + warps_total - 1) / warps_total;
}

}  // namespace flint
