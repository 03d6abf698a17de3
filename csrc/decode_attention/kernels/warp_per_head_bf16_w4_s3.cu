#include "decode_attention/kernel_warp_per_head.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry warp_per_head_bf16_w4_s3() { return warp_per_head_entry<detail::KvBf16, 4, 3>(); }

}  // namespace flint
