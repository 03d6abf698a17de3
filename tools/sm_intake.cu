// How many bytes per second one SM takes in, by kind of load: bulk copies
// (cp.async.bulk into a ring of shared-memory slots per warp, as the decode
// kernel streams pages) of 8 or 16 KB with 1-3 in flight per warp, and plain
// 16-byte loads by 256 threads. One CTA of 8 warps per SM (every variant
// reserves 200 KB of shared memory), on 64 and on all SMs, each CTA reading
// its own 16 MB (L2 cold). On an H200 the kernel's 8 KB copies take in ~50
// GB/s per SM; this says whether another kind takes in more.
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     tools/sm_intake.cu -o /tmp/sm_intake && /tmp/sm_intake
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ptx/arch.cuh"
#include "ptx/bulk_copy.cuh"
#include "ptx/mbarrier.cuh"

namespace {

constexpr int kWarps = 8;
constexpr int kSmemBytes = 200 * 1024;  // one CTA per SM whatever the variant uses
constexpr size_t kBytesPerCta = size_t(16) << 20;

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e = (x);                                                          \
    if (e != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

// Each warp streams its eighth of the CTA's bytes in copies of kCopy bytes
// through kSlots slots, refilling a slot as soon as its copy has landed.
template <int kCopy, int kSlots>
__global__ void __launch_bounds__(32 * kWarps, 1) bulk_intake(const uint8_t* src, int* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bars[kWarps * kSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t share = kBytesPerCta / kWarps;
  const uint8_t* from = src + blockIdx.x * kBytesPerCta + warp * share;
  const int n = static_cast<int>(share / kCopy);
  const uint32_t ring = flint::ptx::smem_addr(smem) + warp * kSlots * kCopy;
  const uint32_t bar0 = flint::ptx::smem_addr(&bars[warp * kSlots]);
  if (lane == 0) {
    for (int s = 0; s < kSlots; ++s) flint::ptx::mbarrier_init(bar0 + 8 * s, 1);
    flint::ptx::fence_mbarrier_init();
  }
  __syncwarp();
  auto issue = [&](int k) {
    if (lane == 0 && k < n) {
      const uint32_t bar = bar0 + 8 * (k % kSlots);
      flint::ptx::mbarrier_arrive_expect_tx(bar, kCopy);
      flint::ptx::bulk_copy_g2s(ring + (k % kSlots) * kCopy, from + size_t(k) * kCopy, kCopy, bar);
    }
  };
  for (int k = 0; k < kSlots; ++k) issue(k);
  int acc = 0;
  for (int k = 0; k < n; ++k) {
    flint::ptx::mbarrier_wait_parity(bar0 + 8 * (k % kSlots), (k / kSlots) & 1);
    acc += smem[warp * kSlots * kCopy + (k % kSlots) * kCopy + lane];
    __syncwarp();
    issue(k + kSlots);
  }
  if (acc == 0x7fffffff) *sink = acc;  // never true: keeps the reads
}

// 256 threads, 16-byte loads, kUnroll in flight per thread.
template <int kUnroll>
__global__ void __launch_bounds__(32 * kWarps, 1) ldg_intake(const uint4* src, int* sink) {
  const size_t n = kBytesPerCta / 16;
  const uint4* from = src + blockIdx.x * n;
  uint32_t acc = 0;
  for (size_t i = threadIdx.x; i < n; i += size_t(kUnroll) * blockDim.x) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(from + i + size_t(u) * blockDim.x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x7fffffffu) *sink = static_cast<int>(acc);
}

float time_us(const void* kernel, const void* src, int* sink, int ctas) {
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int rep = 0; rep < 7; ++rep) {
    CHECK(cudaEventRecord(a));
    void* args[] = {&src, &sink};
    CHECK(cudaLaunchKernel(kernel, dim3(ctas), dim3(32 * kWarps), args, kSmemBytes, nullptr));
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (rep > 0) ts.push_back(ms * 1e3f);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint8_t* src = nullptr;
  int* sink = nullptr;
  CHECK(cudaMalloc(&src, size_t(sms) * kBytesPerCta));
  CHECK(cudaMemset(src, 1, size_t(sms) * kBytesPerCta));
  CHECK(cudaMalloc(&sink, sizeof(int)));
  struct V {
    const char* name;
    const void* k;
  };
  auto as_v = [](auto* k) { return reinterpret_cast<const void*>(k); };
  const V variants[] = {
      {"bulk 8 KB x1 per warp", as_v(bulk_intake<8192, 1>)},
      {"bulk 8 KB x2 per warp", as_v(bulk_intake<8192, 2>)},
      {"bulk 8 KB x3 per warp", as_v(bulk_intake<8192, 3>)},
      {"bulk 16 KB x1 per warp", as_v(bulk_intake<16384, 1>)},
      {"ld.global.cs 16 B x4 per thread", as_v(ldg_intake<4>)},
      {"ld.global.cs 16 B x8 per thread", as_v(ldg_intake<8>)},
  };
  std::printf("| load | CTAs | µs | TB/s | GB/s per SM |\n|---|---|---|---|---|\n");
  for (const V& v : variants) {
    for (int ctas : {64, 96, sms}) {
      const float us = time_us(v.k, src, sink, ctas);
      const double bytes = double(ctas) * kBytesPerCta;
      std::printf("| %s | %d | %.1f | %.2f | %.1f |\n", v.name, ctas, us, bytes / us / 1e6,
                  kBytesPerCta / us / 1e3);
    }
  }
  return 0;
}
