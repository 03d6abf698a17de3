// CPU path of flint::decode_attention. It serves two purposes: running the op
// where there is no Hopper GPU, and being the tight yardstick for the CUDA
// kernel. So it follows the kernel's numerics (fp32 accumulation, exp2 with the
// scale folded into log2(e), P rounded to bf16 for P V) rather than textbook
// softmax; only summation orders differ. It also checks the data-dependent
// contract (seq_lens range, block ids) that the GPU cannot check without a sync.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "decode_attention/numerics.h"
#include "decode_attention/params.h"
#include "ops/params_from_tensors.h"
#include "ops/validation.h"

namespace flint {
namespace {

float bf16_to_float(uint16_t bits) {
  return static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
}

// Round to nearest even, as the kernel's cvt.rn.bf16x2.f32.
uint16_t float_to_bf16(float x) { return c10::BFloat16(x).x; }

// The kernel's MMA operand type per cache format: bf16 for a bf16 cache; fp16
// for an fp8 one (e4m3 converts to it exactly; P and q are rounded to it, q
// after the power-of-two scale of numerics.h).
struct Bf16Elem {
  using Bits = uint16_t;
  static float to_float(Bits b) { return bf16_to_float(b); }
  static float round_operand(float x) { return bf16_to_float(float_to_bf16(x)); }
  static constexpr bool kScaledQ = false;
};
struct Fp8Elem {
  using Bits = uint8_t;
  static float to_float(Bits b) {
    return static_cast<float>(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()));
  }
  static float round_operand(float x) { return static_cast<float>(c10::Half(x)); }
  static constexpr bool kScaledQ = true;
};

// Positions [start, end) that query token i of request b attends to: its
// own position seq_len - q_tokens + i and the window before it. A token
// before position 0 (seq_len < q_tokens, padding rows) attends to nothing.
struct Span {
  int start;
  int end;
  bool empty() const { return start >= end; }
};

Span attended_span(const DecodeParams& p, int b, int i) {
  const int64_t end = int64_t{p.seq_lens[b]} - p.q_tokens + i + 1;
  if (end <= 0) return {0, 0};
  const int64_t start = p.window > 0 ? std::max<int64_t>(end - p.window, 0) : 0;
  return {static_cast<int>(start), static_cast<int>(end)};
}

// The positions any query token of request b attends to: their union, from
// the first token at a position >= 0 to the last token (the spans end at
// consecutive positions).
Span request_span(const DecodeParams& p, int b) {
  const Span first = attended_span(p, b, std::max(p.q_tokens - p.seq_lens[b], 0));
  const Span last = attended_span(p, b, p.q_tokens - 1);
  return last.empty() ? last : Span{first.start, last.end};
}

// The fp8 scale of kv head kvh (1 for a bf16 cache).
float kv_scale(const float* scale, int stride, int kvh) {
  return scale == nullptr ? 1.f : scale[stride * kvh];
}

// What the GPU takes on trust (checking it there would need a device sync):
// every seq_len fits its block-table row, every block it attends exists, and
// the fp8 scales are finite and > 0.
void check_data_contract(const DecodeParams& p) {
  for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) {
    const float ks = kv_scale(p.k_scale, p.k_scale_stride, kvh);
    const float vs = kv_scale(p.v_scale, p.v_scale_stride, kvh);
    TORCH_CHECK(std::isfinite(ks) && ks > 0.f && std::isfinite(vs) && vs > 0.f &&
                    std::isfinite(p.scale_log2 * ks),
                "flint.decode_attention: k_scale and v_scale must be finite and > 0 (and "
                "k_scale * scale * log2(e) finite in float32), got ", ks, " and ", vs,
                " for kv head ", kvh);
  }
  const int64_t max_len = int64_t{kPageTokens} * p.max_blocks;
  for (int b = 0; b < p.batch; ++b) {
    const int seq_len = p.seq_lens[b];
    TORCH_CHECK(seq_len >= 0 && seq_len <= max_len, "flint.decode_attention: seq_lens[", b,
                "] must be in [0, 16 * block_tables.size(1)] = [0, ", max_len, "], got ",
                seq_len);
    const Span span = request_span(p, b);
    if (span.empty()) continue;
    const int32_t* row = p.block_tables + b * p.bt_stride_b;
    for (int page = span.start / kPageTokens; page <= (span.end - 1) / kPageTokens; ++page) {
      TORCH_CHECK(row[page] >= 0 && row[page] < p.num_blocks,
                  "flint.decode_attention: block_tables[", b, ", ", page, "] (attended by request ",
                  b, ") must be a block of kv_cache, in [0, ", p.num_blocks, "), got ", row[page]);
    }
  }
}

// Row [K | V] (2 x head_dim elements) of position `pos` of request b in kv head kvh.
template <class Elem>
const typename Elem::Bits* token_row(const DecodeParams& p, int b, int kvh, int pos) {
  const int64_t block = p.block_tables[b * p.bt_stride_b + pos / kPageTokens];
  return static_cast<const typename Elem::Bits*>(p.kv_cache) + block * p.kv_stride_block +
         kvh * p.kv_stride_head + (pos % kPageTokens) * int64_t{2} * p.head_dim;
}

// Scratch space of one task, reused across its (request, kv head) pairs.
struct Scratch {
  std::vector<float> q;       // [head_dim][rows]
  std::vector<float> scores;  // [positions][rows]
  std::vector<float> o;       // [rows][head_dim]
  std::vector<float> kv;      // one K or V row
};

// The query rows of kv head kvh of request b: row r = i * group + j is query
// token i of query head kvh * group + j, as the kernels' MMA row tile orders
// them. Each row attends its own span; K/V rows are read once for all rows.
// With an fp8 cache, K and V are used as stored and the scales applied in
// fp32: k_scale folds into the softmax scale c (the logits are q . K_stored),
// v_scale into the final normalization (out = v_scale x O_stored /
// denominator), as on the GPU.
template <class Elem>
void attend(const DecodeParams& p, int b, int kvh, Scratch& w) {
  const int dim = p.head_dim, group = p.group, rows = group * p.q_tokens;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto head_of = [&](int r) { return kvh * group + r % group; };
  const auto out_row = [&](int r) {
    return p.out + b * p.out_stride_b + (r / group) * p.out_stride_t + head_of(r) * p.out_stride_h;
  };
  // The sink of row r in log2 units, -inf without sinks.
  const auto sink_log2 = [&](int r) {
    return p.sinks == nullptr ? neg_inf : p.sinks[head_of(r)] * kLog2eF;
  };
  // lse = ln(sum_p exp(s_p) + exp(sink)) from the log2 domain: ln 2 x (m c +
  // log2(l + 2^(sink - m c))); with m c = -inf only the sink is left, as given.
  const auto write_lse = [&](int r, float ms, float l) {
    if (p.lse == nullptr) return;
    const float lse = ms == neg_inf ? (p.sinks == nullptr ? neg_inf : p.sinks[head_of(r)])
                                    : (ms + std::log2(l + std::exp2(sink_log2(r) - ms))) * kLn2F;
    p.lse[b * p.lse_stride_b + (r / group) * p.lse_stride_t + head_of(r) * p.lse_stride_h] = lse;
  };

  Span tokens[kMaxQueryTokens];
  for (int i = 0; i < p.q_tokens; ++i) tokens[i] = attended_span(p, b, i);
  const Span span = request_span(p, b);
  if (span.empty()) {
    for (int r = 0; r < rows; ++r) {
      std::fill_n(out_row(r), dim, uint16_t{0});
      write_lse(r, neg_inf, 0.f);
    }
    return;
  }
  const int n = span.end - span.start;
  const auto attends = [&](int r, int pos) {
    const Span& t = tokens[r / group];
    return pos >= t.start && pos < t.end;
  };

  // q transposed to [dim][row]: the inner loops below then run over the rows
  // (or the dims) with independent accumulators, so they vectorize while each
  // sum keeps its sequential fp32 order.
  // fp8: q in fp16, scaled by 2^-e per row tile (the 8 rows r / 8 that one
  // MMA tile holds on the GPU), e from the tile's largest |q|; its logits
  // come out 2^-e too small.
  w.q.assign(static_cast<size_t>(dim) * rows, 0.f);
  float q_max[kMaxQueryTokens * kMaxGroup / kRowTile] = {};  // std::fmax skips NaN, as fmaxf
  for (int r = 0; r < rows; ++r) {
    const uint16_t* qh =
        p.q + b * p.q_stride_b + (r / group) * p.q_stride_t + head_of(r) * p.q_stride_h;
    for (int d = 0; d < dim; ++d) {
      w.q[d * rows + r] = bf16_to_float(qh[d]);
      q_max[r / kRowTile] = std::fmax(q_max[r / kRowTile], std::fabs(w.q[d * rows + r]));
    }
  }
  int q_exp[kMaxQueryTokens * kMaxGroup / kRowTile] = {};
  if (Elem::kScaledQ) {
    for (int r = 0; r < rows; ++r) {
      q_exp[r / kRowTile] = q_exponent(q_max[r / kRowTile]);
      const float down = exp2i(-q_exp[r / kRowTile]);
      for (int d = 0; d < dim; ++d) w.q[d * rows + r] = Elem::round_operand(w.q[d * rows + r] * down);
    }
  }

  // Scores s = q . K, unscaled, and each row's max over its own span.
  w.scores.assign(static_cast<size_t>(n) * rows, 0.f);
  w.kv.resize(dim);
  float m[kMaxQueryTokens * kMaxGroup];
  std::fill_n(m, rows, neg_inf);
  for (int i = 0; i < n; ++i) {
    const auto* row = token_row<Elem>(p, b, kvh, span.start + i);
    for (int d = 0; d < dim; ++d) w.kv[d] = Elem::to_float(row[d]);
    float* s = w.scores.data() + static_cast<size_t>(i) * rows;
    for (int d = 0; d < dim; ++d) {
      const float k = w.kv[d];
      const float* qd = w.q.data() + static_cast<size_t>(d) * rows;
      for (int r = 0; r < rows; ++r) s[r] += qd[r] * k;
    }
    for (int r = 0; r < rows; ++r) {
      if (attends(r, span.start + i)) m[r] = std::max(m[r], s[r]);  // NaN passed over, as fmaxf
    }
  }

  // p = exp2(s * c - m * c), the exponent formed by one fma as on the GPU;
  // l sums the fp32 p, while P V uses p rounded to the MMA operand type.
  // When m * c is -inf (every logit -inf, or overflowing fp32 below -FLT_MAX)
  // every p is 0 and the shift is 0 instead of -inf, which would make -inf -
  // -inf = NaN of each p; the sink term below keeps m * c (docs/semantics.md,
  // Non-finite values). A position outside a row's span adds nothing to it.
  const float c0 = p.scale_log2 * kv_scale(p.k_scale, p.k_scale_stride, kvh);
  float c[kMaxQueryTokens * kMaxGroup], ms[kMaxQueryTokens * kMaxGroup];
  float shift[kMaxQueryTokens * kMaxGroup], l[kMaxQueryTokens * kMaxGroup] = {};
  for (int r = 0; r < rows; ++r) {
    c[r] = c0 * exp2i(q_exp[r / kRowTile]);
    ms[r] = m[r] * c[r];
    shift[r] = ms[r] == neg_inf ? 0.f : ms[r];
  }
  w.o.assign(static_cast<size_t>(rows) * dim, 0.f);
  for (int i = 0; i < n; ++i) {
    const auto* row = token_row<Elem>(p, b, kvh, span.start + i);
    for (int d = 0; d < dim; ++d) w.kv[d] = Elem::to_float(row[dim + d]);
    const float* s = w.scores.data() + static_cast<size_t>(i) * rows;
    for (int r = 0; r < rows; ++r) {
      if (!attends(r, span.start + i)) continue;
      const float pr = std::exp2(std::fma(s[r], c[r], -shift[r]));
      l[r] += pr;
      const float pb = Elem::round_operand(pr);
      float* o = w.o.data() + static_cast<size_t>(r) * dim;
      for (int d = 0; d < dim; ++d) o[d] += pb * w.kv[d];
    }
  }

  // The sink is one more logit: it only adds exp(sink - m) to the denominator
  // (+inf for a finite sink when m * c is -inf: the output is then 0). A
  // token with nothing to attend writes zeros.
  const float v_scale = kv_scale(p.v_scale, p.v_scale_stride, kvh);
  for (int r = 0; r < rows; ++r) {
    uint16_t* oh = out_row(r);
    if (tokens[r / group].empty()) {
      std::fill_n(oh, dim, uint16_t{0});
      write_lse(r, neg_inf, 0.f);
      continue;
    }
    const float inv = v_scale / (l[r] + std::exp2(sink_log2(r) - ms[r]));
    const float* o = w.o.data() + static_cast<size_t>(r) * dim;
    for (int d = 0; d < dim; ++d) oh[d] = float_to_bf16(o[d] * inv);
    write_lse(r, ms[r], l[r]);
  }
}

void decode_attention_cpu(const DecodeArgs& args) {
  check_decode_attention_args(args);
  if (args.q.size(0) == 0) return;
  const DecodeParams p = params_from_tensors(args);
  check_data_contract(p);

  // One task per (request, kv head): each reads its K/V rows once for all its
  // query rows, as one CTA group does on the GPU.
  const int64_t num_bh = int64_t{p.batch} * p.num_kv_heads;
  at::parallel_for(0, num_bh, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    const auto attend_pair = p.kv_dtype == KvDtype::kFp8E4m3 ? &attend<Fp8Elem> : &attend<Bf16Elem>;
    for (int64_t bh = begin; bh < end; ++bh) {
      attend_pair(p, static_cast<int>(bh / p.num_kv_heads), static_cast<int>(bh % p.num_kv_heads),
                  scratch);
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(flint, CPU, m) {
  m.impl("decode_attention", &dispatcher_entry<&decode_attention_cpu>);
}

}  // namespace flint
