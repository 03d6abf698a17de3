// Host side of the CUDA kernel: picks the compiled variant for a launch
// configuration and launches it. No torch headers.
#pragma once

#include <string>

#include <cuda_runtime.h>

#include "decode_attention/launch_config.h"
#include "decode_attention/params.h"

namespace flint {

// Empty if `cfg` can run `batch * num_kv_heads` (request, kv head) pairs,
// else why not (no compiled variant, too many splits for the merge). With
// `timeline`, among the few variants that record the diagnostic timeline.
std::string check_launch_config(const LaunchConfig& cfg, bool timeline = false);

// CTAs in the grid of `cfg` for the call `params` describes, at most (a
// warp-per-head grid is cut to what the GPU holds at once).
int64_t num_ctas(const DecodeParams& params, const LaunchConfig& cfg);

// Launches on `stream`; `sliding` sets the shared-memory padding rule and
// `pdl` the programmatic-stream-serialization attribute. A non-null
// params.timeline launches the variant that records it.
cudaError_t launch_decode_attention(const DecodeParams& params, const LaunchConfig& cfg,
                                    bool sliding, bool pdl, cudaStream_t stream);

}  // namespace flint
