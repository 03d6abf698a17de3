#include "decode_attention/kernel_split.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry split_bf16_w4_s3() { return split_entry<detail::KvBf16, 4, 3, 0>(); }

}  // namespace flint
