// Placeholder so the build exercises nvcc for sm_90a until the kernel lands.
__global__ void flint_placeholder_kernel() {}
