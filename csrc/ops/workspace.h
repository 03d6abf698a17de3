// Persistent per-device workspace of the CUDA path: fp32 partials of the merges
// across CTAs and self-resetting arrival counters.
#pragma once

#include <cstdint>
#include <mutex>

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

namespace flint {

struct Workspace {
  float* part_o;       // [max_partials, 8, 128]
  float* part_ml;      // [max_partials, 2, 8]
  int32_t* counters;   // [max_counters], zero between launches (each resets itself)
  int64_t max_partials, max_counters;  // what a launch may use: launch_shape says
};

// The workspace of a device, with the lock that orders its users: hold the
// lease until the launch that uses it is queued, so that no other host thread
// queues a launch in between the stream ordering and this one.
struct WorkspaceLease {
  Workspace& ws;
  std::unique_lock<std::mutex> lock;
};

// The workspace of `device`, allocated once at a fixed maximum sized from the
// SM count and never replaced, so captured CUDA graphs keep valid pointers.
// Counters are zeroed only at allocation: launches sharing them must not
// overlap, so a launch on another stream than the previous one first waits for
// that stream: eagerly, and between streams of one CUDA-graph capture (the
// wait becomes a graph edge; one capture at a time per device). A graph's
// replay is ordered only on its replay stream. Raises if the first call for a
// device happens inside a capture.
WorkspaceLease lease_workspace(const at::Device& device, cudaStream_t stream);

}  // namespace flint
