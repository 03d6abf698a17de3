#include "ops/validation.h"

#include <algorithm>
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

// A tensor and a name, for the checks that pair tensors up.
struct Named {
  const at::Tensor* tensor;
  const char* name;
};

// Whether two elements of `t` may be one: false only where that is ruled out
// from sizes and strides alone. Its dims of more than one element, by
// increasing stride, must each have a stride beyond the largest offset the
// dims before them reach (sum of (size - 1) * stride); then every element has
// its own offset. Any rank; SymInts, so that it runs on fake tensors too.
bool may_overlap_itself(const at::Tensor& t) {
  if (t.sym_numel() <= 1) return false;
  std::vector<std::pair<c10::SymInt, c10::SymInt>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.sym_size(d) > 1) dims.emplace_back(t.sym_stride(d), t.sym_size(d));
  }
  std::sort(dims.begin(), dims.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  c10::SymInt reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return true;
    reach = reach + (size - 1) * stride;
  }
  return false;
}

// The bytes of its storage that a non-empty tensor's elements lie in:
// [begin, end), from its storage offset to one element past its last (torch
// strides are >= 0). Gaps between elements count as covered.
std::pair<c10::SymInt, c10::SymInt> byte_span(const at::Tensor& t) {
  c10::SymInt last = t.sym_storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last = last + (t.sym_size(d) - 1) * t.sym_stride(d);
  const int64_t item = static_cast<int64_t>(t.itemsize());
  return {t.sym_storage_offset() * item, (last + 1) * item};
}

std::string byte_range(const at::Tensor& t) {
  const auto [begin, end] = byte_span(t);
  return c10::str("[", begin, ", ", end, ")");
}

// Whether writing `out` may change what `t` reads (or another output): they
// are views of one storage whose byte spans meet, whatever their strides
// (interleaved views that never touch are refused too: ruling that out takes
// more than a range test). Storage offsets rather than data pointers, so that
// it holds for meta and fake tensors; different storages cost no guard.
bool may_share_memory(const at::Tensor& out, const at::Tensor& t) {
  const c10::Storage& so = out.unsafeGetTensorImpl()->unsafe_storage();
  if (!so || !so.is_alias_of(t.unsafeGetTensorImpl()->unsafe_storage())) return false;
  if (out.sym_numel() == 0 || t.sym_numel() == 0) return false;
  const auto [out_begin, out_end] = byte_span(out);
  const auto [t_begin, t_end] = byte_span(t);
  return out_begin < t_end && t_begin < out_end;
}

// Each output element is written by one thread while the inputs are read: an
// output's elements must be distinct, and no output may share bytes with an
// input or with another output.
void check_no_aliasing(const std::vector<Named>& outputs, const std::vector<Named>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto [out, out_name] = outputs[i];
    TORCH_CHECK(!may_overlap_itself(*out), "flint.decode_attention: ", out_name,
                " must not have overlapping elements (its strides, in increasing order, must "
                "each exceed the largest offset the dims with smaller strides reach; an expanded "
                "tensor's stride 0 does not), got shape ", out->sym_sizes(), " and strides ",
                out->sym_strides());
    const auto check_apart = [&](const Named& other) {
      const auto [t, name] = other;
      TORCH_CHECK(!may_share_memory(*out, *t), "flint.decode_attention: ", out_name,
                  " must not share memory with ", name, " (their byte ranges in one storage "
                  "must not meet), got ", out_name, " over bytes ", byte_range(*out), " and ",
                  name, " over ", byte_range(*t));
    };
    for (size_t j = i + 1; j < outputs.size(); ++j) check_apart(outputs[j]);
    for (const Named& input : inputs) check_apart(input);
  }
}

// q and out: the kernels read / write each head's dims as 16-byte vectors.
void check_rows(const at::Tensor& t, const char* name) {
  const int64_t last = t.dim() - 1;
  TORCH_CHECK(t.sym_stride(last) == 1, "flint.decode_attention: ", name,
              " must have a contiguous last dim (stride(", last, ") == 1), got strides ",
              t.sym_strides());
  bool aligned = aligned16(t);
  for (int64_t d = 0; d < last; ++d) aligned = aligned && t.sym_stride(d) % 8 == 0;
  TORCH_CHECK(aligned, "flint.decode_attention: ", name, " rows must be 16-byte aligned (every "
              "stride but the last a multiple of 8 and a 16-byte aligned data pointer), got "
              "strides ", t.sym_strides(), " and ", where(t));
}

void check_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous(), "flint.decode_attention: ", name, " must be contiguous, got "
              "strides ", t.sym_strides());
}

}  // namespace

void check_decode_attention_args(const DecodeArgs& a) {
  const at::Tensor& q = a.q;
  const at::Tensor& kv_cache = a.kv_cache;
  const at::Tensor& out = a.out;
  check_dtype(q, "q", at::kBFloat16);
  check_kv_dtype(kv_cache);
  check_dtype(a.block_tables, "block_tables", at::kInt);
  check_dtype(a.seq_lens, "seq_lens", at::kInt);
  check_dtype(out, "out", at::kBFloat16);
  if (a.sinks) check_dtype(*a.sinks, "sinks", at::kFloat);
  if (a.lse) check_dtype(*a.lse, "lse", at::kFloat);

  TORCH_CHECK(q.dim() == 3 || q.dim() == 4, "flint.decode_attention: q must be [batch, "
              "num_heads, head_dim] (one query token per request) or [batch, q_tokens, "
              "num_heads, head_dim], got a ", q.dim(), "-D tensor of shape ", q.sym_sizes());
  const bool multi = a.multi_token();
  check_rank(kv_cache, "kv_cache", 4, "[num_blocks, num_kv_heads, 16, 2 * head_dim]");
  check_rank(a.block_tables, "block_tables", 2, "[batch, max_blocks]");
  check_rank(a.seq_lens, "seq_lens", 1, "[batch]");
  if (a.sinks) check_rank(*a.sinks, "sinks", 1, "[num_heads]");

  const c10::SymInt batch = q.sym_size(0);
  const c10::SymInt q_tokens = multi ? q.sym_size(1) : c10::SymInt(1);
  const c10::SymInt num_heads = q.sym_size(-2);
  const c10::SymInt head_dim = q.sym_size(-1);
  const c10::SymInt num_kv_heads = kv_cache.sym_size(1);
  TORCH_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256, "flint.decode_attention: "
              "q must have head_dim 64, 128 or 256 (its last dim), got shape ", q.sym_sizes());
  TORCH_CHECK(q_tokens >= 1 && q_tokens <= kMaxQueryTokens, "flint.decode_attention: q must "
              "have 1 to ", kMaxQueryTokens, " query tokens per request (dim 1 of [batch, "
              "q_tokens, num_heads, head_dim]), got shape ", q.sym_sizes());
  TORCH_CHECK(kv_cache.sym_size(2) == kPageTokens && kv_cache.sym_size(3) == 2 * head_dim,
              "flint.decode_attention: kv_cache must be [num_blocks, num_kv_heads, ",
              kPageTokens, ", 2 * head_dim] = [num_blocks, num_kv_heads, 16, ", 2 * head_dim,
              "] (16-token blocks, K in the first head_dim of the last dim, V in the second), "
              "got shape ", kv_cache.sym_sizes());
  TORCH_CHECK(num_kv_heads >= 1, "flint.decode_attention: kv_cache must have at least one kv "
              "head, got shape ", kv_cache.sym_sizes());
  TORCH_CHECK(num_heads % num_kv_heads == 0 && num_heads >= num_kv_heads &&
                  num_heads <= kMaxGroup * num_kv_heads,
              "flint.decode_attention: q's num_heads must be group x num_kv_heads with a group "
              "(query heads per kv head) of 1 to ", kMaxGroup, ", got num_heads ", num_heads,
              " with num_kv_heads ", num_kv_heads, " (from kv_cache)");
  TORCH_CHECK(out.sym_sizes() == q.sym_sizes(), "flint.decode_attention: out must have the shape "
              "of q ", q.sym_sizes(), ", got ", out.sym_sizes());
  TORCH_CHECK(a.block_tables.sym_size(0) == batch, "flint.decode_attention: block_tables must "
              "have ", batch, " rows (the batch size of q), got shape ",
              a.block_tables.sym_sizes());
  TORCH_CHECK(a.seq_lens.sym_size(0) == batch, "flint.decode_attention: seq_lens must have ",
              batch, " entries (the batch size of q), got shape ", a.seq_lens.sym_sizes());
  if (a.sinks) {
    TORCH_CHECK(a.sinks->sym_size(0) == num_heads, "flint.decode_attention: sinks must have "
                "num_heads = ", num_heads, " entries (one logit per query head), got shape ",
                a.sinks->sym_sizes());
  }
  if (a.lse) {
    TORCH_CHECK(a.lse->sym_sizes() == q.sym_sizes().slice(0, q.dim() - 1),
                "flint.decode_attention: lse must have the shape of q without its last dim, ",
                q.sym_sizes().slice(0, q.dim() - 1), ", got ", a.lse->sym_sizes());
  }

  // The HND page layout every backend assumes: each (block, kv head) is one
  // contiguous, 16-byte aligned page.
  TORCH_CHECK(kv_cache.sym_stride(3) == 1 && kv_cache.sym_stride(2) == 2 * head_dim,
              "flint.decode_attention: kv_cache pages must be contiguous (stride(2) == 2 * "
              "head_dim == ", 2 * head_dim, ", stride(3) == 1), got strides ",
              kv_cache.sym_strides());
  const int64_t elems16 = 16 / kv_cache.element_size();  // elements in 16 bytes
  TORCH_CHECK(kv_cache.sym_stride(0) % elems16 == 0 && kv_cache.sym_stride(1) % elems16 == 0 &&
                  aligned16(kv_cache),
              "flint.decode_attention: kv_cache pages must be 16-byte aligned (stride(0) and "
              "stride(1) multiples of ", elems16, ", 16-byte aligned data pointer), got strides ",
              kv_cache.sym_strides(), " and ", where(kv_cache));
  check_rows(q, "q");
  check_rows(out, "out");
  TORCH_CHECK(a.block_tables.sym_stride(1) == 1 || a.block_tables.sym_size(1) <= 1,
              "flint.decode_attention: block_tables rows must be contiguous (stride(1) == 1), "
              "got strides ", a.block_tables.sym_strides());
  check_contiguous(a.seq_lens, "seq_lens");
  if (a.sinks) check_contiguous(*a.sinks, "sinks");

  const auto device = q.device();
  const bool fp8 = kv_cache.scalar_type() == at::kFloat8_e4m3fn;
  check_scale(a.k_scale, "k_scale", fp8, num_kv_heads, device);
  check_scale(a.v_scale, "v_scale", fp8, num_kv_heads, device);
  std::vector<Named> inputs = {{&q, "q"}, {&kv_cache, "kv_cache"},
                               {&a.block_tables, "block_tables"}, {&a.seq_lens, "seq_lens"}};
  if (a.sinks) inputs.push_back({&*a.sinks, "sinks"});
  if (a.k_scale) inputs.push_back({&*a.k_scale, "k_scale"});
  if (a.v_scale) inputs.push_back({&*a.v_scale, "v_scale"});
  std::vector<Named> outputs = {{&out, "out"}};
  if (a.lse) outputs.push_back({&*a.lse, "lse"});
  for (const auto& group : {inputs, outputs}) {
    for (const auto& [t, name] : group) {
      TORCH_CHECK(t->device() == device, "flint.decode_attention: all tensors must be on one "
                  "device; q is on ", device, " but ", name, " is on ", t->device());
    }
  }
  check_no_aliasing(outputs, inputs);

  // The kernels index with int32 (DecodeParams).
  TORCH_CHECK(batch * num_heads * q_tokens <= INT32_MAX, "flint.decode_attention: batch x "
              "num_heads x q_tokens must be <= 2^31 - 1, got ", batch, " x ", num_heads, " x ",
              q_tokens);
  TORCH_CHECK(a.block_tables.sym_size(1) <= INT32_MAX / kPageTokens &&
                  kv_cache.sym_size(0) <= INT32_MAX,
              "flint.decode_attention: 16 * max_blocks and num_blocks must fit int32, got "
              "block_tables ", a.block_tables.sym_sizes(), " and kv_cache ",
              kv_cache.sym_sizes());

  TORCH_CHECK(!a.window.has_value() || *a.window >= 1, "flint.decode_attention: window must be "
              "None or >= 1, got ", a.window.value_or(0));
  // The kernels use scale * log2(e) as a float32.
  TORCH_CHECK(std::isfinite(a.scale) && a.scale > 0.0 &&
                  std::isfinite(static_cast<float>(a.scale * kLog2e)),
              "flint.decode_attention: scale must be finite and > 0 (and scale * log2(e) "
              "finite in float32), got ", a.scale);
}

// The Meta kernel of flint::decode_attention is these checks and nothing else
// (the op returns nothing and writes out in place: there is no output to
// describe). FakeTensorMode and torch.compile run it on fake tensors, so a
// traced call raises the real op's errors, word for word; devices, all meta
// here, are checked by the Python wrapper (flint_attention/ops.py).
TORCH_LIBRARY_IMPL(flint, Meta, m) {
  m.impl("decode_attention", &dispatcher_entry<&check_decode_attention_args>);
}

}  // namespace flint
