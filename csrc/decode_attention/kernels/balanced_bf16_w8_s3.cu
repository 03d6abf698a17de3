#include "decode_attention/kernel_balanced.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry balanced_bf16_w8_s3() { return balanced_entry<detail::KvBf16, 8, 3>(); }

}  // namespace flint
