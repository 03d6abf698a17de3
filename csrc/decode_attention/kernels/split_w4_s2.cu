#include "decode_attention/kernel.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry split_w4_s2() { return split_entry<4, 2, 0>(); }

}  // namespace flint
