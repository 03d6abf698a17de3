// Autograd kernel of flint::decode_attention. The op has no derivative: it
// writes `out` in place and returns nothing, like torch's out= functions, and
// refuses autograd as they do: while grad mode is on, any tensor argument that
// requires grad (an input, `out` or `lse`) raises at the call, naming it, instead of
// the gradient silently missing the attention (or a leaf that requires grad
// being overwritten). Under torch.no_grad() or torch.inference_mode() the op
// runs as always. Then the backend (or Meta) kernel runs, and `out`'s version
// counter is bumped as any in-place write does.
#include <optional>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

namespace flint {
namespace {

void check_no_grad(const at::Tensor& t, const char* name) {
  TORCH_CHECK(!t.defined() || !t.requires_grad(), "flint.decode_attention is not "
              "differentiable (it writes out in place, like torch's out= functions), but ", name,
              " requires grad; call it under torch.no_grad() or torch.inference_mode(), or pass ",
              name, ".detach()");
}

using Signature = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const std::optional<at::Tensor>&, std::optional<int64_t>, double,
                       const at::Tensor&, const std::optional<at::Tensor>&,
                       const std::optional<at::Tensor>&, const std::optional<at::Tensor>&);

void decode_attention_autograd(c10::DispatchKeySet keys, const at::Tensor& q,
                               const at::Tensor& kv_cache, const at::Tensor& block_tables,
                               const at::Tensor& seq_lens, const std::optional<at::Tensor>& sinks,
                               std::optional<int64_t> window, double scale, const at::Tensor& out,
                               const std::optional<at::Tensor>& k_scale,
                               const std::optional<at::Tensor>& v_scale,
                               const std::optional<at::Tensor>& lse) {
  if (at::GradMode::is_enabled()) {
    check_no_grad(q, "q");
    check_no_grad(kv_cache, "kv_cache");
    if (sinks) check_no_grad(*sinks, "sinks");
    if (k_scale) check_no_grad(*k_scale, "k_scale");
    if (v_scale) check_no_grad(*v_scale, "v_scale");
    check_no_grad(out, "out");
    if (lse) check_no_grad(*lse, "lse");
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("flint::decode_attention", "")
                             .typed<Signature>();
  {
    const at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatch(keys & c10::after_ADInplaceOrView_keyset, q, kv_cache, block_tables, seq_lens,
                  sinks, window, scale, out, k_scale, v_scale, lse);
  }
  // An inference tensor has no version counter (torch refuses in-place writes
  // to one outside inference mode; flint, which never saves tensors for
  // backward, lets it be).
  if (out.defined() && !out.is_inference()) out.unsafeGetTensorImpl()->bump_version();
  if (lse && lse->defined() && !lse->is_inference()) lse->unsafeGetTensorImpl()->bump_version();
}

}  // namespace

TORCH_LIBRARY_IMPL(flint, Autograd, m) {
  m.impl("decode_attention", &decode_attention_autograd);
}

}  // namespace flint
