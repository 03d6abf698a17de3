#include "ops/validation.h"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include "decode_attention/params.h"

namespace flint {
namespace {

void check_dtype(const at::Tensor& t, const char* name, at::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, "flint.decode_attention: ", name, " must be ",
              c10::toString(expected), ", got ", t.scalar_type());
}

void check_rank(const at::Tensor& t, const char* name, int64_t rank, const char* shape) {
  TORCH_CHECK(t.dim() == rank, "flint.decode_attention: ", name, " must be ", shape,
              " (", rank, "-D), got a ", t.dim(), "-D tensor of shape ", t.sizes());
}

// The cache may be bf16 or fp8 e4m3 (vLLM's kv_cache_dtype="fp8"); every other
// element type, the other fp8 flavours included, is named in the error.
void check_kv_dtype(const at::Tensor& kv_cache) {
  const at::ScalarType t = kv_cache.scalar_type();
  TORCH_CHECK(t == at::kBFloat16 || t == at::kFloat8_e4m3fn, "flint.decode_attention: kv_cache "
              "must be BFloat16 or Float8_e4m3fn (fp8 e4m3, with k_scale and v_scale), got ", t,
              t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fnuz || t == at::kFloat8_e5m2fnuz
                  ? " (only the e4m3fn flavour of fp8 is supported)"
                  : "");
}

// k_scale / v_scale: required for an fp8 cache and refused for a bf16 one; fp32
// [1] (per tensor) or [num_kv_heads] (per kv head), on q's device.
void check_scale(const std::optional<at::Tensor>& scale, const char* name, bool fp8,
                 int64_t num_kv_heads, const at::Device& device) {
  if (!fp8) {
    TORCH_CHECK(!scale.has_value(), "flint.decode_attention: ", name, " applies only to an fp8 "
                "kv_cache, but kv_cache is BFloat16: pass ", name, "=None");
    return;
  }
  TORCH_CHECK(scale.has_value(), "flint.decode_attention: ", name, " is required with an fp8 "
              "(Float8_e4m3fn) kv_cache: a float32 tensor of shape [1] or [num_kv_heads] = [",
              num_kv_heads, "] (dequantized = stored x scale)");
  const at::Tensor& s = *scale;
  TORCH_CHECK(s.scalar_type() == at::kFloat, "flint.decode_attention: ", name,
              " must be Float, got ", s.scalar_type());
  TORCH_CHECK(s.dim() == 1 && (s.size(0) == 1 || s.size(0) == num_kv_heads),
              "flint.decode_attention: ", name, " must have shape [1] (per tensor) or "
              "[num_kv_heads] = [", num_kv_heads, "] (per kv head), got shape ", s.sizes());
  TORCH_CHECK(s.stride(0) == 1 || s.size(0) == 1, "flint.decode_attention: ", name,
              " must be contiguous, got strides ", s.strides());
  TORCH_CHECK(s.device() == device, "flint.decode_attention: all tensors must be on one "
              "device; q is on ", device, " but ", name, " is on ", s.device());
}

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// q and out: the kernel reads / writes each head's 128 dims as 16-byte vectors.
void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.stride(2) == 1, "flint.decode_attention: ", name,
              " must have a contiguous last dim (stride(2) == 1), got strides ", t.strides());
  TORCH_CHECK(t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && aligned16(t),
              "flint.decode_attention: ", name,
              " rows must be 16-byte aligned (stride(0), stride(1) multiples of 8 and a "
              "16-byte aligned data pointer), got strides ",
              t.strides(), " and data pointer ", t.data_ptr());
}

}  // namespace

void check_decode_attention_args(const at::Tensor& q, const at::Tensor& kv_cache,
                                 const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                 const at::Tensor& sinks, std::optional<int64_t> window,
                                 double scale, const at::Tensor& out,
                                 const std::optional<at::Tensor>& k_scale,
                                 const std::optional<at::Tensor>& v_scale) {
  check_dtype(q, "q", at::kBFloat16);
  check_kv_dtype(kv_cache);
  check_dtype(block_tables, "block_tables", at::kInt);
  check_dtype(seq_lens, "seq_lens", at::kInt);
  check_dtype(sinks, "sinks", at::kFloat);
  check_dtype(out, "out", at::kBFloat16);

  check_rank(q, "q", 3, "[batch, num_heads, 128]");
  check_rank(kv_cache, "kv_cache", 4, "[num_blocks, num_kv_heads, 16, 256]");
  check_rank(block_tables, "block_tables", 2, "[batch, max_blocks]");
  check_rank(seq_lens, "seq_lens", 1, "[batch]");
  check_rank(sinks, "sinks", 1, "[num_heads]");
  check_rank(out, "out", 3, "[batch, num_heads, 128]");

  const int64_t batch = q.size(0);
  const int64_t num_heads = q.size(1);
  const int64_t num_kv_heads = kv_cache.size(1);
  TORCH_CHECK(q.size(2) == kHeadDim, "flint.decode_attention: q must have head_dim ", kHeadDim,
              " (shape [batch, num_heads, 128]), got shape ", q.sizes());
  TORCH_CHECK(kv_cache.size(2) == kPageTokens && kv_cache.size(3) == kRowElems,
              "flint.decode_attention: kv_cache must be [num_blocks, num_kv_heads, ",
              kPageTokens, ", ", kRowElems, "] (16-token blocks, K in [..., :128], V in "
              "[..., 128:]), got shape ", kv_cache.sizes());
  TORCH_CHECK(num_kv_heads >= 1, "flint.decode_attention: kv_cache must have at least one kv "
              "head, got shape ", kv_cache.sizes());
  TORCH_CHECK(num_heads == kGqa * num_kv_heads, "flint.decode_attention: q must have num_heads "
              "== 8 * num_kv_heads (GQA group 8) = ", kGqa * num_kv_heads, ", got num_heads ",
              num_heads, " with num_kv_heads ", num_kv_heads);
  TORCH_CHECK(out.sizes() == q.sizes(), "flint.decode_attention: out must have the shape of q ",
              q.sizes(), ", got ", out.sizes());
  TORCH_CHECK(block_tables.size(0) == batch, "flint.decode_attention: block_tables must have ",
              batch, " rows (the batch size of q), got shape ", block_tables.sizes());
  TORCH_CHECK(seq_lens.size(0) == batch, "flint.decode_attention: seq_lens must have ", batch,
              " entries (the batch size of q), got shape ", seq_lens.sizes());
  TORCH_CHECK(sinks.size(0) == num_heads, "flint.decode_attention: sinks must have num_heads = ",
              num_heads, " entries, got shape ", sinks.sizes());

  // The HND page layout every backend assumes: each (block, kv head) is one
  // contiguous, 16-byte aligned page (8 KB of bf16, 4 KB of fp8).
  TORCH_CHECK(kv_cache.stride(3) == 1 && kv_cache.stride(2) == kRowElems,
              "flint.decode_attention: kv_cache pages must be contiguous (stride(2) == 256, "
              "stride(3) == 1), got strides ", kv_cache.strides());
  const int64_t elems16 = 16 / kv_cache.element_size();  // elements in 16 bytes
  TORCH_CHECK(kv_cache.stride(0) % elems16 == 0 && kv_cache.stride(1) % elems16 == 0 &&
                  aligned16(kv_cache),
              "flint.decode_attention: kv_cache pages must be 16-byte aligned (stride(0) and "
              "stride(1) multiples of ", elems16, ", 16-byte aligned data pointer), got strides ",
              kv_cache.strides(), " and data pointer ", kv_cache.data_ptr());
  check_rows(q, "q");
  check_rows(out, "out");
  TORCH_CHECK(block_tables.stride(1) == 1 || block_tables.size(1) <= 1,
              "flint.decode_attention: block_tables rows must be contiguous (stride(1) == 1), "
              "got strides ", block_tables.strides());
  TORCH_CHECK(seq_lens.is_contiguous(), "flint.decode_attention: seq_lens must be contiguous, "
              "got strides ", seq_lens.strides());
  TORCH_CHECK(sinks.is_contiguous(), "flint.decode_attention: sinks must be contiguous, got "
              "strides ", sinks.strides());

  const auto device = q.device();
  const bool fp8 = kv_cache.scalar_type() == at::kFloat8_e4m3fn;
  check_scale(k_scale, "k_scale", fp8, num_kv_heads, device);
  check_scale(v_scale, "v_scale", fp8, num_kv_heads, device);
  const std::pair<const at::Tensor*, const char*> others[] = {
      {&kv_cache, "kv_cache"}, {&block_tables, "block_tables"}, {&seq_lens, "seq_lens"},
      {&sinks, "sinks"},       {&out, "out"}};
  for (const auto& [t, name] : others) {
    TORCH_CHECK(t->device() == device, "flint.decode_attention: all tensors must be on one "
                "device; q is on ", device, " but ", name, " is on ", t->device());
  }

  // Every output element is written by one thread, and the inputs are read
  // while outputs are written: overlapping rows or aliasing would race.
  TORCH_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes, "flint.decode_attention: "
              "out must not have overlapping rows (e.g. an expanded tensor), got strides ",
              out.strides());
  std::vector<std::pair<const at::Tensor*, const char*>> inputs = {
      {&q, "q"}, {&kv_cache, "kv_cache"}, {&block_tables, "block_tables"},
      {&seq_lens, "seq_lens"}, {&sinks, "sinks"}};
  if (k_scale) inputs.emplace_back(&*k_scale, "k_scale");
  if (v_scale) inputs.emplace_back(&*v_scale, "v_scale");
  for (const auto& [t, name] : inputs) {
    const at::MemOverlapStatus overlap = at::get_overlap_status(out, *t);
    TORCH_CHECK(overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::Partial,
                "flint.decode_attention: out must not share memory with ", name);
  }

  // The kernels index with int32 (DecodeParams).
  TORCH_CHECK(batch * num_kv_heads <= INT32_MAX, "flint.decode_attention: batch x num_kv_heads "
              "must be <= 2^31 - 1, got ", batch, " x ", num_kv_heads);
  TORCH_CHECK(block_tables.size(1) <= INT32_MAX / kPageTokens && kv_cache.size(0) <= INT32_MAX,
              "flint.decode_attention: 16 * max_blocks and num_blocks must fit int32, got "
              "block_tables ", block_tables.sizes(), " and kv_cache ", kv_cache.sizes());

  TORCH_CHECK(!window.has_value() || *window >= 1, "flint.decode_attention: window must be None "
              "or >= 1, got ", window.value_or(0));
  // The kernels use scale * log2(e) as a float32.
  TORCH_CHECK(std::isfinite(scale) && scale > 0.0 &&
                  std::isfinite(static_cast<float>(scale * kLog2e)),
              "flint.decode_attention: scale must be finite and > 0 (and scale * log2(e) "
              "finite in float32), got ", scale);
}

}  // namespace flint
