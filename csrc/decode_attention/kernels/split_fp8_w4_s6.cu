#include "decode_attention/kernel_split.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry split_fp8_w4_s6() { return split_entry<detail::KvFp8, 4, 6, 0>(); }

}  // namespace flint
