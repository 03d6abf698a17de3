#include "decode_attention/kernel_split.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry split_bf16_w9_s2() { return split_entry<detail::KvBf16, 9, 2, 0>(); }

}  // namespace flint
