#include "ops/workspace.h"

#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "decode_attention/params.h"

namespace flint {
namespace {

// Partials per SM: a balanced launch uses 4 per CTA of its one-wave grid (one
// CTA per SM), a split launch at most 2 (pairs x splits <= 2 x SMs); the
// rest is headroom. Counters: 8 per partial (split launches: 8 per pair and
// 8 per partial, at most 24 per SM).
constexpr int64_t kMaxPartialsPerSm = 8;

// The stream of the last launch that used the workspace, and an event to
// make the next launch's stream wait for it.
struct LastUse {
  bool valid = false;
  cudaStream_t stream = nullptr;  // may be the legacy default stream, nullptr
  unsigned long long capture_id = 0;
  cudaEvent_t done = nullptr;
};

struct DeviceState {
  at::Tensor part_o, part_ml, counters;
  Workspace ws;
  LastUse eager, captured;  // eager launches; launches being captured
};

unsigned long long capture_id_of(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id));
  return status == cudaStreamCaptureStatusActive ? id : 0;
}

// Makes `stream` wait for the last use if that was on another stream, in the
// same capture (capture_id 0: eager). The event is recorded on the last use's
// stream now, which orders everything queued there so far; skipped when that
// stream is no longer in the same capture state (an eager stream that has
// begun a capture since, or a capture that has ended): recording there would
// join the wrong graph, or order nothing.
void order_after(LastUse& last, cudaStream_t stream, unsigned long long capture_id) {
  if (last.valid && last.stream != stream && last.capture_id == capture_id &&
      capture_id_of(last.stream) == capture_id) {
    C10_CUDA_CHECK(cudaEventRecord(last.done, last.stream));
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, last.done, 0));
  }
  last.valid = true;
  last.stream = stream;
  last.capture_id = capture_id;
}

}  // namespace

WorkspaceLease lease_workspace(const at::Device& device, cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<int, DeviceState> states;
  std::unique_lock<std::mutex> lock(mutex);
  const unsigned long long capture_id = capture_id_of(stream);
  const bool capturing = capture_id != 0;
  auto it = states.find(device.index());
  if (it == states.end()) {
    TORCH_CHECK(!capturing, "flint.decode_attention must run eagerly once on ", device,
                " before CUDA graph capture (it allocates its persistent workspace then)");
    const int64_t num_sms = at::cuda::getDeviceProperties(device.index())->multiProcessorCount;
    const int64_t max_partials = kMaxPartialsPerSm * num_sms;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    DeviceState st;
    st.part_o = at::empty({max_partials, kRowTile, kHeadDim}, f32);
    st.part_ml = at::empty({max_partials, 2, kRowTile}, f32);
    st.counters = at::zeros({max_partials * kRowTile}, f32.dtype(at::kInt));
    st.ws = {st.part_o.data_ptr<float>(), st.part_ml.data_ptr<float>(),
             st.counters.data_ptr<int32_t>(), max_partials, max_partials * kRowTile};
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&st.eager.done, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&st.captured.done, cudaEventDisableTiming));
    it = states.emplace(device.index(), std::move(st)).first;
  }
  DeviceState& st = it->second;
  // NOTE: an eager stream cannot be waited on from inside a capture (and
  // would order nothing at replay), so captured launches are ordered only
  // among the streams of their own capture, one capture at a time per device
  // (a launch from another capture starts the tracking afresh).
  if (capturing)
    order_after(st.captured, stream, capture_id);
  else
    order_after(st.eager, stream, 0);
  return {st.ws, std::move(lock)};
}

}  // namespace flint
