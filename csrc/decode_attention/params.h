// Plain description of one decode_attention call, shared by the CUDA kernel,
// its launcher and the CPU path. No torch headers: device code sees only this.
#pragma once

#include <cstdint>

namespace flint {

// The head_dim today's CUDA kernels are built for; the op (and the CPU path)
// takes any shape within the limits below.
constexpr int kHeadDim = 128;                      // per head, q / K / V / out
// A kv head's query rows (group x query tokens) go through the kernels in
// tiles of 8: the n = 8 columns of their MMAs.
constexpr int kRowTile = 8;
constexpr int row_tiles_of(int64_t group, int64_t q_tokens) {
  return static_cast<int>((group * q_tokens + kRowTile - 1) / kRowTile);
}
// Quotients by a run-time divisor d as a multiply, an add and a shift, exact
// for dividends below 2^31 (Granlund-Montgomery with a 33-bit multiplier
// 2^32 + mul; the device side is `divide` in common.cuh): the kernels divide
// tiles by row_tiles and rows by the group at many sites, and an integer
// division by a run-time value is ~20 instructions.
struct FastDiv {
  uint32_t mul, shift;
};
constexpr FastDiv fast_div_of(uint32_t d) {
  uint32_t shift = 0;  // ceil(log2 d)
  while ((uint64_t{1} << shift) < d) ++shift;
  // ceil(2^(32 + shift) / d) - 2^32: 0 for a power of two.
  return {static_cast<uint32_t>(((uint64_t{1} << (32 + shift)) + d - 1) / d - (uint64_t{1} << 32)),
          shift};
}
constexpr uint32_t fast_div(uint32_t n, FastDiv f) {
  return (static_cast<uint32_t>((uint64_t{n} * f.mul) >> 32) + n) >> f.shift;
}
constexpr bool fast_div_exact(uint32_t d_max, uint32_t n_max) {
  for (uint32_t d = 1; d <= d_max; ++d)
    for (uint32_t n = 0; n < n_max; ++n)
      if (fast_div(n, fast_div_of(d)) != n / d) return false;
  return true;
}
static_assert(fast_div_exact(16, 2048), "FastDiv: the multiply-add-shift quotients are exact");
constexpr int kPageTokens = 16;                    // tokens per cache block
constexpr int kRowElems = 2 * kHeadDim;            // one token: [K | V]

// The op's shape limits: a kv head's query rows (group x query tokens) form
// the kernels' MMA row tile, so both are bounded by what one tile can hold.
constexpr int kMaxGroup = 16;                      // query heads per kv head: 1..16
constexpr int kMaxQueryTokens = 8;                 // query tokens per request: 1..8
constexpr bool supported_head_dim(int64_t d) { return d == 64 || d == 128 || d == 256; }

// Softmax in base 2: exp(x) = 2^(x log2(e)); the scale is folded in double, the
// sinks in float (both backends alike).
constexpr double kLog2e = 1.4426950408889634;
constexpr float kLog2eF = static_cast<float>(kLog2e);
constexpr float kLn2F = 0.693147180559945309f;  // ln(2): log2 back to natural log

// Element type of the KV cache. An fp8 cache stores x / scale as e4m3 (vLLM's
// kv_cache_dtype="fp8"): dequantized = stored x scale, with one fp32 scale per
// tensor or per kv head for K and for V.
enum class KvDtype : int { kBf16 = 0, kFp8E4m3 = 1 };

// When a warp refills the ring slot of the page it has just consumed.
enum class Refill : int {
  kKernelRule = -1,       // the kernel's own rule (balanced; warp per head: the launch's)
  kBeforeWait = 0,        // before waiting for its next page: the whole ring in flight
  kAfterWait = 1,         // after: one page fewer in flight, a shorter HBM queue
  kAfterUnlessLate = 2,   // split kernels: after, unless the warp's first page was late
};

// The bytes of a CUtensorMap (the driver's opaque 128-byte descriptor), kept
// opaque here so that the CPU path needs no CUDA headers.
struct alignas(64) KvTensorMap {
  uint64_t opaque[16];
};

struct DecodeParams {
  // fp8 cache: the cache as a tensor map of [num_blocks, num_kv_heads, 16, 256]
  // bytes with boxes of 16 tokens x 128 (a page's K or V half), 128-byte
  // swizzle (KvFp8); set by the launch (launch_plan.cpp), unused for bf16.
  KvTensorMap kv_map;

  // Strides are in elements, as torch reports them.
  const uint16_t* q;           // [batch, num_kv_heads * 8, 128] bf16, stride(2) == 1
  const void* kv_cache;        // [num_blocks, num_kv_heads, 16, 256] kv_dtype, HND
  const int32_t* block_tables; // [batch, max_blocks] int32, stride(1) == 1
  const int32_t* seq_lens;     // [batch] int32, contiguous
  const float* sinks;          // [num_kv_heads * 8] fp32, contiguous; nullptr: no sinks
  const float* k_scale;        // fp8 cache: [1] or [num_kv_heads] fp32; nullptr for bf16
  const float* v_scale;        // likewise for V
  uint16_t* out;               // [batch, num_kv_heads * 8, 128] bf16, stride(2) == 1

  // Workspace of the merges across CTAs (launch_plan.h says how much a launch uses).
  float* part_o;    // [num_partials, 8, 128] fp32 unnormalized partial outputs
  float* part_ml;   // [num_partials, 2, 8] fp32: row max m (unscaled), row sum l
  int32_t* counters;  // arrival counters, zero between launches (each resets itself)

  int64_t q_stride_b, q_stride_h;
  int64_t out_stride_b, out_stride_h;
  int64_t kv_stride_block, kv_stride_head;  // in elements of kv_dtype (bytes for fp8)
  int64_t bt_stride_b;

  int batch;
  int num_kv_heads;
  int num_blocks;   // kv_cache.size(0): block ids are clamped to it on the GPU
  int max_blocks;   // block_tables.size(1): seq_lens are clamped to 16 x this
  int window;       // attend to the last `window` positions; 0 = all
  KvDtype kv_dtype;
  int k_scale_stride, v_scale_stride;  // 1: one scale per kv head; 0: one per tensor
  float scale_log2; // softmax scale * log2(e)

  Refill refill;

  // Split kernels only (kernel_split.cuh), set by the launch.
  int min_pages;    // a split is active when each of its warps gets >= this many pages
  int max_active_splits;  // at most this many splits take pages (one wave)

  // The call's shape (the fields above describe head_dim 128, group 8, one
  // query token; kept first so that the kernels' parameter offsets stay put).
  // q and out are [batch, q_tokens, num_kv_heads * group, head_dim]; query
  // token i of request b sits at position seq_len - q_tokens + i.
  int head_dim;     // 64, 128 or 256
  int group;        // query heads per kv head, 1..kMaxGroup
  int q_tokens;     // query tokens per request, 1..kMaxQueryTokens
  int64_t q_stride_t, out_stride_t;  // between query tokens (0 when q_tokens == 1)
  // The natural-log log-sum-exp of each query row's attended logits and its
  // sink, [batch, q_tokens, num_heads] fp32; nullptr when not asked for.
  float* lse;
  int64_t lse_stride_b, lse_stride_t, lse_stride_h;

  // What the kernels divide: tiles, one per (kv head, row tile). Tile u is
  // tile u % row_tiles of kv head u / row_tiles, rows 8 (u % row_tiles) ..
  // + 7 of its group x q_tokens rows (row r: query token r / group, query
  // head r % group), so a kv head's tiles are neighbours in every division.
  int row_tiles;    // ceil(group x q_tokens / 8)
  int tiles;        // num_kv_heads x row_tiles
  FastDiv by_group, by_row_tiles;  // fast_div_of(group), fast_div_of(row_tiles)
};

// The tile fields of a call of p.group query heads per kv head and p.q_tokens
// tokens (the kernels', the plan's and the testing extension's one formula).
inline void set_tiles(DecodeParams& p) {
  p.row_tiles = row_tiles_of(p.group, p.q_tokens);
  p.tiles = p.num_kv_heads * p.row_tiles;
  p.by_group = fast_div_of(p.group);
  p.by_row_tiles = fast_div_of(p.row_tiles);
}

}  // namespace flint
