#include "decode_attention/kernel.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry cluster8_w4_s2() { return split_entry<4, 2, 8>(); }

}  // namespace flint
