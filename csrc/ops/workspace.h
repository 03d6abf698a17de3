// Persistent per-device workspace of the CUDA path: fp32 split partials and
// self-resetting arrival counters.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

namespace flint {

struct Workspace {
  float* part_o;       // [max_partials, 8, 128]
  float* part_ml;      // [max_partials, 2, 8]
  int32_t* counters;   // [max_partials], zero between launches
  int64_t max_partials;
};

// The workspace of `device`, allocated once at a fixed maximum sized from the
// SM count and never replaced, so captured CUDA graphs keep valid pointers.
// Counters are zeroed only at allocation: launches sharing them must be
// ordered on one stream, so a launch from another stream than the previous one
// first waits for that stream (skipped during graph capture). Raises if the
// first call for a device happens inside a CUDA-graph capture.
Workspace& workspace_for(const at::Device& device, cudaStream_t stream);

}  // namespace flint
