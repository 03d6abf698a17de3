#include "decode_attention/kernel.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry cluster4_w4_s2() { return split_entry<4, 2, 4>(); }

}  // namespace flint
