// How decode_attention_kernel is launched: the heuristic of the reference
// design, from the batch size, kv heads, window and SM count only, so a
// captured CUDA graph stays valid for any sequence lengths.
#pragma once

#include <cstdint>

namespace flint {

struct LaunchConfig {
  int num_splits;  // CTAs per (request, kv head): gridDim.x; 0: one warp per (request, kv
                   // head), decode_attention_warp_per_head_kernel
  int num_warps;   // 4 or 8; the split kernel also 9 or 10 (8 of them merge)
  int num_stages;  // page-ring slots per warp
  int min_pages;   // a split is active when each of its warps gets this many pages
  bool cluster;    // merge the splits in a thread-block cluster (DSMEM)
};

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The reference design's heuristic, from the batch size, kv heads, window,
// the longest sequence the block tables can hold (max_tokens = 16 x their
// width: a shape, so graph-safe) and the SM count, with the changes the H200 sweeps of
// benchmarks/RESULTS.md showed to pay (2026-11-29 c9b5069, 2026-11-30 ee41244,
// and with launch_dependents right after griddepcontrol.wait, device run 10):
//  - sliding, 1..2 requests: a cluster of 4 splits of 4 warps (b1: 2.71 us
//    against 3.12 for a cluster of 8);
//  - sliding, 3..16 requests: 1 split of 4 warps, min_pages 2 (b16: 3.73 us
//    against 4.50 with 8 warps: per-CTA latency, not bytes, rules);
//  - sliding, >= 3 (request, kv head) pairs per SM: one warp per pair, no merge,
//    4 warps and 3 stages (b64: 10.1 us against 11.1 with 2 stages; b256: 36.1
//    against 37.1 with 8 warps, 2 stages);
//  - sliding, other batches above 64: 2 stages, so 3 CTAs share an SM;
//  - full, <= 8 (request, kv head) pairs, block tables of <= 1024 tokens: a
//    cluster of 8 splits of 4 warps (b1 L1k: 3.82 us against 4.92 for 16
//    splits and the last-CTA merge, device run 10; the cluster loses from
//    L8k on, where its 64 CTAs stream too little);
//  - full, <= 8 (request, kv head) pairs, wider tables: num_sms / pairs
//    splits of 9 warps, min_pages 1 at batch <= 2, else 4 (kv heads 1, b8
//    L8k with 8 warps: 12.4 vs 15.5 us with min_pages 1). The kernel keeps
//    as few splits active as give each warp the same largest page count, and
//    lets the warps past 8 stream only where that saves splits: at L8k 15 of
//    9 warps (120 CTAs) instead of 16 of 8 leave 12 SMs free, the next
//    call's CTAs all enter before this one ends and calls stop alternating
//    between ~10.5 and ~13 us (device runs 56-61). Since load_page's bank
//    spread (run 78), 15 of 9 warps beat 13 of 10 at L8k (b1 10.7 against
//    11.4-11.5 us, kv heads 1 b8 10.8 against 11.5; before it 11.5 against
//    11.2) and equal them at L32k (33.9). Launching many idle splits too (20
//    or more) is slower: they hold SMs the next call's active CTAs wait for;
//  - full, 1..2 requests: min_pages 1 (b1 L1k: 5.6 vs 6.8 us), and twice as
//    many splits as the SMs take once, of which the kernel keeps one wave
//    active (max_active_splits) and the rest leave at once: b1 L8k 11.74 us
//    against 12.17, b1 L32k 34.39 against 34.98 (device run 16; why the idle
//    CTAs help is not measured);
//  - full, 3..4 requests: as many 8-warp splits as the SMs take once (b4 L8k:
//    35.7 vs 36.7 us for twice as many 4-warp splits).
inline LaunchConfig default_launch_config(int batch, int num_kv_heads, bool sliding,
                                          int64_t max_tokens, int num_sms) {
  const int num_bh = batch * num_kv_heads;
  auto at_least_1 = [](int x) { return x < 1 ? 1 : x; };
  if (sliding) {
    if (batch <= 2) return {4, 4, 2, 1, true};
    if (num_bh >= 3 * num_sms) return {0, 4, 3, 1, false};
    if (batch <= 16) return {1, 4, 2, 2, false};
    return {1, 4, batch <= 64 ? 3 : 2, 1, false};
  }
  if (num_bh <= 8 && max_tokens <= 1024) return {8, 4, 2, 1, true};
  if (num_bh <= 8) return {at_least_1(num_sms / num_bh), 9, 2, batch <= 2 ? 1 : 4, false};
  if (batch <= 2) return {at_least_1(2 * num_sms / num_bh), 8, 2, 1, false};
  if (batch <= 4) return {at_least_1(num_sms / num_bh), 8, 2, 2, false};
  return {at_least_1(2 * num_sms / num_bh), 4, 3, 2, false};
}

// Shared memory an SM has for CTAs; non-sliding launches pad theirs so that at
// most 8 / num_warps CTAs share an SM (see launch.cu).
constexpr int kSmemPerSm = 228 * 1024;

}  // namespace flint
