#include "decode_attention/kernel_balanced.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry balanced_fp8_w8_s5() { return balanced_entry<detail::KvFp8, 8, 5>(); }

}  // namespace flint
