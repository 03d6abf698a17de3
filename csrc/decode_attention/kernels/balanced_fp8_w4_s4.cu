#include "decode_attention/kernel_balanced.cuh"
#include "decode_attention/kernels/registry.h"

namespace flint {

KernelEntry balanced_fp8_w4_s4() { return balanced_entry<detail::KvFp8, 4, 4>(); }

}  // namespace flint
