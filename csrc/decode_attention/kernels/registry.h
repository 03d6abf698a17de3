// The compiled kernels: one explicit instantiation per file of this folder, so
// that they compile in parallel; launch_plan.cpp holds the table of them.
#pragma once

namespace flint {

// A kernel's host stub (for cudaLaunchKernelExC) and its shared memory.
struct KernelEntry {
  const void* fn;
  int smem_bytes;
};

// What plan_launch picks (launch_plan.cpp), nothing else.
KernelEntry balanced_bf16_w8_s2();
KernelEntry balanced_fp8_w8_s4();
KernelEntry split_bf16_w4_s2();
KernelEntry split_bf16_w4_s3();
KernelEntry split_bf16_w8_s2();
KernelEntry split_bf16_w9_s2();
KernelEntry cluster4_bf16_w4_s2();
KernelEntry warp_per_head_bf16_w4_s3();
KernelEntry split_fp8_w4_s4();
KernelEntry split_fp8_w4_s6();
KernelEntry split_fp8_w8_s4();
KernelEntry split_fp8_w9_s4();
KernelEntry cluster4_fp8_w4_s4();
KernelEntry warp_per_head_fp8_w4_s6();

}  // namespace flint
