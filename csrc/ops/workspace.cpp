#include "ops/workspace.h"

#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "decode_attention/params.h"

namespace flint {
namespace {

// Partials per SM: the heuristic uses at most 2 (num_bh x splits <= 2 x SMs);
// the rest is headroom for tuned configurations.
constexpr int64_t kMaxPartialsPerSm = 4;

struct DeviceState {
  at::Tensor part_o, part_ml, counters;
  Workspace ws;
  cudaStream_t last_stream = nullptr;
  cudaEvent_t last_done = nullptr;
};

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

Workspace& workspace_for(const at::Device& device, cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<int, DeviceState> states;
  std::lock_guard<std::mutex> lock(mutex);
  const bool capturing = is_capturing(stream);
  auto it = states.find(device.index());
  if (it == states.end()) {
    TORCH_CHECK(!capturing, "flint.decode_attention must run eagerly once on ", device,
                " before CUDA graph capture (it allocates its persistent workspace then)");
    const int64_t num_sms = at::cuda::getDeviceProperties(device.index())->multiProcessorCount;
    const int64_t max_partials = kMaxPartialsPerSm * num_sms;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    DeviceState st;
    st.part_o = at::empty({max_partials, kGqa, kHeadDim}, f32);
    st.part_ml = at::empty({max_partials, 2, kGqa}, f32);
    st.counters = at::zeros({max_partials}, f32.dtype(at::kInt));
    st.ws = {st.part_o.data_ptr<float>(), st.part_ml.data_ptr<float>(),
             st.counters.data_ptr<int32_t>(), max_partials};
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&st.last_done, cudaEventDisableTiming));
    it = states.emplace(device.index(), std::move(st)).first;
  }
  DeviceState& st = it->second;
  if (!capturing) {
    if (st.last_stream != nullptr && st.last_stream != stream) {
      C10_CUDA_CHECK(cudaEventRecord(st.last_done, st.last_stream));
      C10_CUDA_CHECK(cudaStreamWaitEvent(stream, st.last_done, 0));
    }
    st.last_stream = stream;
  }
  return st.ws;
}

}  // namespace flint
