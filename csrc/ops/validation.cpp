#include "ops/validation.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/library.h>

#include "decode_attention/params.h"

namespace flint {
namespace {

// A None passed through the dispatcher for a Tensor argument arrives undefined.
void check_defined(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), "flint.decode_attention: ", name, " must be a tensor, got None");
}

void check_dtype(const at::Tensor& t, const char* name, at::ScalarType expected) {
  check_defined(t, name);
  TORCH_CHECK(t.scalar_type() == expected, "flint.decode_attention: ", name, " must be ",
              c10::toString(expected), ", got ", t.scalar_type());
}

void check_rank(const at::Tensor& t, const char* name, int64_t rank, const char* shape) {
  TORCH_CHECK(t.dim() == rank, "flint.decode_attention: ", name, " must be ", shape,
              " (", rank, "-D), got a ", t.dim(), "-D tensor of shape ", t.sym_sizes());
}

// The cache may be bf16 or fp8 e4m3 (vLLM's kv_cache_dtype="fp8"); every other
// element type, the other fp8 flavours included, is named in the error.
void check_kv_dtype(const at::Tensor& kv_cache) {
  check_defined(kv_cache, "kv_cache");
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
                 const c10::SymInt& num_kv_heads, const at::Device& device) {
  if (!fp8) {
    TORCH_CHECK(!scale.has_value(), "flint.decode_attention: ", name, " applies only to an fp8 "
                "kv_cache, but kv_cache is BFloat16: pass ", name, "=None");
    return;
  }
  TORCH_CHECK(scale.has_value(), "flint.decode_attention: ", name, " is required with an fp8 "
              "(Float8_e4m3fn) kv_cache: a float32 tensor of shape [1] or [num_kv_heads] = [",
              num_kv_heads, "] (dequantized = stored x scale)");
  const at::Tensor& s = *scale;
  check_defined(s, name);
  TORCH_CHECK(s.scalar_type() == at::kFloat, "flint.decode_attention: ", name,
              " must be Float, got ", s.scalar_type());
  TORCH_CHECK(s.dim() == 1 && (s.sym_size(0) == 1 || s.sym_size(0) == num_kv_heads),
              "flint.decode_attention: ", name, " must have shape [1] (per tensor) or "
              "[num_kv_heads] = [", num_kv_heads, "] (per kv head), got shape ", s.sym_sizes());
  TORCH_CHECK(s.sym_stride(0) == 1 || s.sym_size(0) == 1, "flint.decode_attention: ", name,
              " must be contiguous, got strides ", s.sym_strides());
  TORCH_CHECK(s.device() == device, "flint.decode_attention: all tensors must be on one "
              "device; q is on ", device, " but ", name, " is on ", s.device());
}

// Meta and fake tensors (FakeTensorMode, torch.compile) have no data: for them
// the checks below read the storage offset and assume an aligned allocation,
// as every torch allocator gives. Their error messages name what was read.
bool aligned16(const at::Tensor& t) {
  if (t.is_meta()) return t.sym_storage_offset() * static_cast<int64_t>(t.itemsize()) % 16 == 0;
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

std::string where(const at::Tensor& t) {
  if (t.is_meta()) return c10::str("storage offset ", t.sym_storage_offset());
  return c10::str("data pointer ", t.data_ptr());
}

// Would writing `out` race with itself: a dim of size > 1 with stride 0 (the
// case at::has_internal_overlap calls certain).
bool has_repeated_elements(const at::Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.sym_size(d) > 1 && t.sym_stride(d) == 0) return true;
  }
  return false;
}

// at::get_overlap_status's verdict (Full or Partial), from storage offsets
// rather than data pointers so that it holds for meta and fake tensors too:
// the same tensor, or two dense tensors of one storage whose byte ranges meet.
bool shares_memory(const at::Tensor& a, const at::Tensor& b) {
  if (a.is_same(b)) return true;
  if (a.sym_numel() == 0 || b.sym_numel() == 0) return false;
  if (!a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense()) return false;
  const c10::Storage& sa = a.unsafeGetTensorImpl()->unsafe_storage();
  if (!sa || !sa.is_alias_of(b.unsafeGetTensorImpl()->unsafe_storage())) return false;
  const int64_t ia = static_cast<int64_t>(a.itemsize()), ib = static_cast<int64_t>(b.itemsize());
  const c10::SymInt a_begin = a.sym_storage_offset() * ia, b_begin = b.sym_storage_offset() * ib;
  return a_begin < b_begin + b.sym_numel() * ib && b_begin < a_begin + a.sym_numel() * ia;
}

// q and out: the kernel reads / writes each head's 128 dims as 16-byte vectors.
void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.sym_stride(2) == 1, "flint.decode_attention: ", name,
              " must have a contiguous last dim (stride(2) == 1), got strides ", t.sym_strides());
  TORCH_CHECK(t.sym_stride(0) % 8 == 0 && t.sym_stride(1) % 8 == 0 && aligned16(t),
              "flint.decode_attention: ", name,
              " rows must be 16-byte aligned (stride(0), stride(1) multiples of 8 and a "
              "16-byte aligned data pointer), got strides ",
              t.sym_strides(), " and ", where(t));
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

  const c10::SymInt batch = q.sym_size(0);
  const c10::SymInt num_heads = q.sym_size(1);
  const c10::SymInt num_kv_heads = kv_cache.sym_size(1);
  TORCH_CHECK(q.sym_size(2) == kHeadDim, "flint.decode_attention: q must have head_dim ", kHeadDim,
              " (shape [batch, num_heads, 128]), got shape ", q.sym_sizes());
  TORCH_CHECK(kv_cache.sym_size(2) == kPageTokens && kv_cache.sym_size(3) == kRowElems,
              "flint.decode_attention: kv_cache must be [num_blocks, num_kv_heads, ",
              kPageTokens, ", ", kRowElems, "] (16-token blocks, K in [..., :128], V in "
              "[..., 128:]), got shape ", kv_cache.sym_sizes());
  TORCH_CHECK(num_kv_heads >= 1, "flint.decode_attention: kv_cache must have at least one kv "
              "head, got shape ", kv_cache.sym_sizes());
  TORCH_CHECK(num_heads == kGqa * num_kv_heads, "flint.decode_attention: q must have num_heads "
              "== 8 * num_kv_heads (GQA group 8) = ", kGqa * num_kv_heads, ", got num_heads ",
              num_heads, " with num_kv_heads ", num_kv_heads);
  TORCH_CHECK(out.sym_sizes() == q.sym_sizes(), "flint.decode_attention: out must have the shape "
              "of q ", q.sym_sizes(), ", got ", out.sym_sizes());
  TORCH_CHECK(block_tables.sym_size(0) == batch, "flint.decode_attention: block_tables must have ",
              batch, " rows (the batch size of q), got shape ", block_tables.sym_sizes());
  TORCH_CHECK(seq_lens.sym_size(0) == batch, "flint.decode_attention: seq_lens must have ", batch,
              " entries (the batch size of q), got shape ", seq_lens.sym_sizes());
  TORCH_CHECK(sinks.sym_size(0) == num_heads, "flint.decode_attention: sinks must have num_heads "
              "= ", num_heads, " entries, got shape ", sinks.sym_sizes());

  // The HND page layout every backend assumes: each (block, kv head) is one
  // contiguous, 16-byte aligned page (8 KB of bf16, 4 KB of fp8).
  TORCH_CHECK(kv_cache.sym_stride(3) == 1 && kv_cache.sym_stride(2) == kRowElems,
              "flint.decode_attention: kv_cache pages must be contiguous (stride(2) == 256, "
              "stride(3) == 1), got strides ", kv_cache.sym_strides());
  const int64_t elems16 = 16 / kv_cache.element_size();  // elements in 16 bytes
  TORCH_CHECK(kv_cache.sym_stride(0) % elems16 == 0 && kv_cache.sym_stride(1) % elems16 == 0 &&
                  aligned16(kv_cache),
              "flint.decode_attention: kv_cache pages must be 16-byte aligned (stride(0) and "
              "stride(1) multiples of ", elems16, ", 16-byte aligned data pointer), got strides ",
              kv_cache.sym_strides(), " and ", where(kv_cache));
  check_rows(q, "q");
  check_rows(out, "out");
  TORCH_CHECK(block_tables.sym_stride(1) == 1 || block_tables.sym_size(1) <= 1,
              "flint.decode_attention: block_tables rows must be contiguous (stride(1) == 1), "
              "got strides ", block_tables.sym_strides());
  TORCH_CHECK(seq_lens.is_contiguous(), "flint.decode_attention: seq_lens must be contiguous, "
              "got strides ", seq_lens.sym_strides());
  TORCH_CHECK(sinks.is_contiguous(), "flint.decode_attention: sinks must be contiguous, got "
              "strides ", sinks.sym_strides());

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
  TORCH_CHECK(!has_repeated_elements(out), "flint.decode_attention: out must not have "
              "overlapping rows (e.g. an expanded tensor), got strides ", out.sym_strides());
  std::vector<std::pair<const at::Tensor*, const char*>> inputs = {
      {&q, "q"}, {&kv_cache, "kv_cache"}, {&block_tables, "block_tables"},
      {&seq_lens, "seq_lens"}, {&sinks, "sinks"}};
  if (k_scale) inputs.emplace_back(&*k_scale, "k_scale");
  if (v_scale) inputs.emplace_back(&*v_scale, "v_scale");
  for (const auto& [t, name] : inputs) {
    TORCH_CHECK(!shares_memory(out, *t), "flint.decode_attention: out must not share memory "
                "with ", name);
  }

  // The kernels index with int32 (DecodeParams).
  TORCH_CHECK(batch * num_kv_heads <= INT32_MAX, "flint.decode_attention: batch x num_kv_heads "
              "must be <= 2^31 - 1, got ", batch, " x ", num_kv_heads);
  TORCH_CHECK(block_tables.sym_size(1) <= INT32_MAX / kPageTokens &&
                  kv_cache.sym_size(0) <= INT32_MAX,
              "flint.decode_attention: 16 * max_blocks and num_blocks must fit int32, got "
              "block_tables ", block_tables.sym_sizes(), " and kv_cache ", kv_cache.sym_sizes());

  TORCH_CHECK(!window.has_value() || *window >= 1, "flint.decode_attention: window must be None "
              "or >= 1, got ", window.value_or(0));
  // The kernels use scale * log2(e) as a float32.
  TORCH_CHECK(std::isfinite(scale) && scale > 0.0 &&
                  std::isfinite(static_cast<float>(scale * kLog2e)),
              "flint.decode_attention: scale must be finite and > 0 (and scale * log2(e) "
              "finite in float32), got ", scale);
}

// The Meta kernel of flint::decode_attention is these checks and nothing else
// (the op returns nothing and writes out in place: there is no output to
// describe). FakeTensorMode and torch.compile run it on fake tensors, so a
// traced call raises the real op's errors, word for word; devices, all meta
// here, are checked by the Python wrapper (flint_attention/ops.py).
TORCH_LIBRARY_IMPL(flint, Meta, m) { m.impl("decode_attention", &check_decode_attention_args); }

}  // namespace flint
