// The launch both stamped builds share (balanced_phases.cu, split_phases.cu):
// a probe kernel (DecodeParams, uint64_t* stamps) launched on the current
// stream as the op launches the plan it was built from: its shared memory
// and carve-out, the persistent workspace, PDL.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "decode_attention/launch_plan.h"
#include "decode_attention/params.h"
#include "ops/workspace.h"

namespace flint {

inline void launch_probe(const void* fn, DecodeParams p, const LaunchShape& shape, bool pdl,
                         const at::Tensor& stamps, const char* who) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      shape.smem_bytes));
  C10_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const WorkspaceLease lease = lease_workspace(stamps.device(), stream);
  TORCH_CHECK(shape.partials <= lease.ws.max_partials && shape.counters <= lease.ws.max_counters,
              who, ": the workspace is too small for this launch");
  p.part_o = lease.ws.part_o;
  p.part_ml = lease.ws.part_ml;
  p.counters = lease.ws.counters;
  uint64_t* stamp_ptr = reinterpret_cast<uint64_t*>(stamps.data_ptr<int64_t>());
  cudaLaunchConfig_t launch = {};
  launch.gridDim = shape.grid;
  launch.blockDim = shape.block;
  launch.dynamicSmemBytes = shape.smem_bytes;
  launch.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  launch.attrs = &attr;
  launch.numAttrs = 1;
  void* args[] = {&p, &stamp_ptr};
  C10_CUDA_CHECK(cudaLaunchKernelExC(&launch, fn, args));
}

}  // namespace flint
