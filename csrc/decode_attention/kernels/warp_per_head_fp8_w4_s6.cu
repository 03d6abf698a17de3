#include "decode_attention/kernel_warp_per_head.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry warp_per_head_fp8_w4_s6() { return warp_per_head_entry<detail::KvFp8, 4, 6>(); }

}  // namespace flint
