#include "decode_attention/kernel.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry split_w8_s2() { return split_entry<8, 2, 0>(); }

}  // namespace flint
