#include "decode_attention/kernel_balanced.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry balanced_fp8_w8_s2() { return balanced_entry<detail::KvFp8, 8, 2>(); }

}  // namespace flint
