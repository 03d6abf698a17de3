// Built only without the CUDA kernel (no nvcc, or FLINT_CPU_ONLY=1; setup.py):
// CUDA tensors get this error instead of the dispatcher's "could not run
// 'flint::decode_attention' with arguments from the 'CUDA' backend".
#include <optional>

#include <torch/library.h>

namespace flint {
namespace {

void decode_attention_no_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const std::optional<at::Tensor>&,
                              std::optional<int64_t>, double, const at::Tensor&,
                              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                              const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "flint.decode_attention: this build of flint has no CUDA kernel: it was "
              "built without a CUDA toolkit (nvcc) or with FLINT_CPU_ONLY=1, so it runs only on "
              "CPU tensors. Pass CPU tensors, or rebuild with the CUDA 13 toolkit (see the "
              "README, Requirements)");
}

}  // namespace

TORCH_LIBRARY_IMPL(flint, CUDA, m) { m.impl("decode_attention", &decode_attention_no_cuda); }

}  // namespace flint
