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

// Positions [start, end) of request b that the query attends to.
struct Span {
  int start;
  int end;
};

Span attended_span(const DecodeParams& p, int b) {
  const int seq_len = p.seq_lens[b];
  const int start = p.window > 0 ? std::max(seq_len - p.window, 0) : 0;
  return {start, seq_len};
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
    const Span span = attended_span(p, b);
    if (span.start >= span.end) continue;
    const int32_t* row = p.block_tables + b * p.bt_stride_b;
    for (int page = span.start / kPageTokens; page <= (span.end - 1) / kPageTokens; ++page) {
      TORCH_CHECK(row[page] >= 0 && row[page] < p.num_blocks,
                  "flint.decode_attention: block_tables[", b, ", ", page, "] (attended by request ",
                  b, ") must be a block of kv_cache, in [0, ", p.num_blocks, "), got ", row[page]);
    }
  }
}

// Row [K | V] of position `pos` of request b in kv head kvh.
template <class Elem>
const typename Elem::Bits* token_row(const DecodeParams& p, int b, int kvh, int pos) {
  const int64_t block = p.block_tables[b * p.bt_stride_b + pos / kPageTokens];
  return static_cast<const typename Elem::Bits*>(p.kv_cache) + block * p.kv_stride_block +
         kvh * p.kv_stride_head + (pos % kPageTokens) * kRowElems;
}

// The 8 query heads of kv head kvh of request b. `scores` is scratch space
// reused across calls. With an fp8 cache, K and V are used as stored and the
// scales applied in fp32: k_scale folds into the softmax scale c (the logits
// are q . K_stored), v_scale into the final normalization (out = v_scale x
// O_stored / denominator), as on the GPU.
template <class Elem>
void attend(const DecodeParams& p, int b, int kvh, std::vector<float>& scores) {
  uint16_t* out = p.out + b * p.out_stride_b + int64_t{kvh} * kGqa * p.out_stride_h;
  const Span span = attended_span(p, b);
  const int n = span.end - span.start;
  if (n <= 0) {
    for (int j = 0; j < kGqa; ++j) std::fill_n(out + j * p.out_stride_h, kHeadDim, uint16_t{0});
    return;
  }

  // q transposed to [dim][head]: the inner loops below then run over the 8
  // heads (or the 128 dims) with independent accumulators, so they vectorize
  // while each sum keeps its sequential fp32 order.
  float q[kHeadDim][kGqa];
  float q_max = 0.f;  // std::fmax skips NaN, as the kernel's fmaxf
  for (int j = 0; j < kGqa; ++j) {
    const uint16_t* qh = p.q + b * p.q_stride_b + int64_t{kvh * kGqa + j} * p.q_stride_h;
    for (int d = 0; d < kHeadDim; ++d) {
      q[d][j] = bf16_to_float(qh[d]);
      q_max = std::fmax(q_max, std::fabs(q[d][j]));
    }
  }
  // fp8: q in fp16, scaled by 2^-e; the logits come out 2^-e too small.
  const int q_exp = Elem::kScaledQ ? q_exponent(q_max) : 0;
  if (Elem::kScaledQ) {
    const float down = exp2i(-q_exp);
    for (int d = 0; d < kHeadDim; ++d)
      for (int j = 0; j < kGqa; ++j) q[d][j] = Elem::round_operand(q[d][j] * down);
  }

  // Scores s = q . K, unscaled, and their max per head.
  scores.resize(static_cast<size_t>(n) * kGqa);
  float m[kGqa];
  std::fill_n(m, kGqa, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < n; ++i) {
    const auto* row = token_row<Elem>(p, b, kvh, span.start + i);
    float k[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) k[d] = Elem::to_float(row[d]);
    float s[kGqa] = {};
    for (int d = 0; d < kHeadDim; ++d) {
      for (int j = 0; j < kGqa; ++j) s[j] += q[d][j] * k[d];
    }
    for (int j = 0; j < kGqa; ++j) {
      scores[i * kGqa + j] = s[j];
      m[j] = std::max(m[j], s[j]);  // a NaN s is passed over, as by fmaxf on the GPU
    }
  }

  // p = exp2(s * c - m * c), the exponent formed by one fma as on the GPU;
  // l sums the fp32 p, while P V uses p rounded to the MMA operand type.
  // When m * c is -inf (every logit -inf, or overflowing fp32 below -FLT_MAX)
  // every p is 0 and the shift is 0 instead of -inf, which would make -inf -
  // -inf = NaN of each p; the sink term below keeps m * c (docs/semantics.md).
  const float c = p.scale_log2 * kv_scale(p.k_scale, p.k_scale_stride, kvh) * exp2i(q_exp);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float ms[kGqa], shift[kGqa];
  float l[kGqa] = {};
  float o[kGqa][kHeadDim] = {};
  for (int j = 0; j < kGqa; ++j) {
    ms[j] = m[j] * c;
    shift[j] = ms[j] == neg_inf ? 0.f : ms[j];
  }
  for (int i = 0; i < n; ++i) {
    const auto* row = token_row<Elem>(p, b, kvh, span.start + i);
    float v[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) v[d] = Elem::to_float(row[kHeadDim + d]);
    for (int j = 0; j < kGqa; ++j) {
      const float pj = std::exp2(std::fma(scores[i * kGqa + j], c, -shift[j]));
      l[j] += pj;
      const float pb = Elem::round_operand(pj);
      for (int d = 0; d < kHeadDim; ++d) o[j][d] += pb * v[d];
    }
  }

  // The sink is one more logit: it only adds exp(sink - m) to the denominator
  // (+inf for a finite sink when m * c is -inf: the output is then 0).
  const float v_scale = kv_scale(p.v_scale, p.v_scale_stride, kvh);
  for (int j = 0; j < kGqa; ++j) {
    const float sink = p.sinks[kvh * kGqa + j];
    const float inv = v_scale / (l[j] + std::exp2(sink * kLog2eF - ms[j]));
    uint16_t* oh = out + j * p.out_stride_h;
    for (int d = 0; d < kHeadDim; ++d) oh[d] = float_to_bf16(o[j][d] * inv);
  }
}

void decode_attention_cpu(const at::Tensor& q, const at::Tensor& kv_cache,
                          const at::Tensor& block_tables, const at::Tensor& seq_lens,
                          const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                          const at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                          const std::optional<at::Tensor>& v_scale) {
  check_decode_attention_args(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                              k_scale, v_scale);
  if (q.size(0) == 0) return;
  const DecodeParams p = params_from_tensors(q, kv_cache, block_tables, seq_lens, sinks, window,
                                             scale, out, k_scale, v_scale);
  check_data_contract(p);

  // One task per (request, kv head): each reads its K/V rows once for all 8
  // query heads, as one CTA group does on the GPU.
  const int64_t num_bh = int64_t{p.batch} * p.num_kv_heads;
  at::parallel_for(0, num_bh, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    const auto attend_pair = p.kv_dtype == KvDtype::kFp8E4m3 ? &attend<Fp8Elem> : &attend<Bf16Elem>;
    for (int64_t bh = begin; bh < end; ++bh) {
      attend_pair(p, static_cast<int>(bh / p.num_kv_heads), static_cast<int>(bh % p.num_kv_heads),
                  scores);
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(flint, CPU, m) { m.impl("decode_attention", &decode_attention_cpu); }

}  // namespace flint
