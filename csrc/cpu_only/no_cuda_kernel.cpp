// Built only without the CUDA kernel (no nvcc, or FLINT_CPU_ONLY=1; setup.py):
// CUDA tensors get this error instead of the dispatcher's "could not run
// 'flint::decode_attention' with arguments from the 'CUDA' backend".
#include <torch/library.h>

#include "ops/decode_args.h"

namespace flint {
namespace {

void decode_attention_no_cuda(const DecodeArgs&) {
  TORCH_CHECK(false, "flint.decode_attention: this build of flint has no CUDA kernel: it was "
              "built without a CUDA toolkit (nvcc) or with FLINT_CPU_ONLY=1, so it runs only on "
              "CPU tensors. Pass CPU tensors, or rebuild with the CUDA 13 toolkit (see the "
              "README, Requirements)");
}

}  // namespace

TORCH_LIBRARY_IMPL(flint, CUDA, m) {
  m.impl("decode_attention", &dispatcher_entry<&decode_attention_no_cuda>);
}

}  // namespace flint
