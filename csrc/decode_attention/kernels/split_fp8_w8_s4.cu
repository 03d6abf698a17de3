#include "decode_attention/kernel_split.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry split_fp8_w8_s4() { return split_entry<detail::KvFp8, 8, 4, 0>(); }

}  // namespace flint
