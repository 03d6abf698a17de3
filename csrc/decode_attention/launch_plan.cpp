#include "decode_attention/launch_plan.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <utility>

#include <cudaTypedefs.h>

#include "decode_attention/hopper.h"
#include "decode_attention/kernels/registry.h"

namespace flint {
namespace {

// Each row's kernel, by its index in kVariants.
template <int... N>
constexpr auto entries(std::integer_sequence<int, N...>) {
  return std::array<KernelEntry (*)(), sizeof...(N)>{&variant_entry<N>::get...};
}
constexpr auto kEntries = entries(std::make_integer_sequence<int, kNumVariants>());
KernelEntry entry_of(const Variant& v) { return kEntries[&v - kVariants](); }

const Variant* find_variant(const LaunchPlan& plan) {
  for (const Variant& v : kVariants) {
    if (v.kind == plan.kind && v.kv == plan.kv && v.warps == plan.warps &&
        v.stages == plan.stages && (v.kind != KernelKind::kCluster || v.cluster == plan.splits))
      return &v;
  }
  return nullptr;
}

// Devices whose per-kernel setup is cached (beyond: redone at every launch).
constexpr int kMaxDevices = 64;

// How many CTAs of a kernel the GPU holds at once: per SM, and the SMs.
struct Residency {
  int sms, per_sm;
  int total() const { return sms * per_sm; }
};

// Per kernel, device and padding, once: the opt-in to > 48 KB of dynamic
// shared memory (and to clusters past 8), and its residency.
cudaError_t prepare(const Variant& v, int device, int smem_bytes, bool sliding, Residency* r) {
  static std::atomic<int> cache[kNumVariants][kMaxDevices][2] = {};  // sms << 8 | per_sm
  const int idx = static_cast<int>(&v - kVariants);
  if (device < kMaxDevices) {
    const int c = cache[idx][device][sliding].load(std::memory_order_relaxed);
    if (c > 0) {
      *r = {c >> 8, c & 0xff};
      return cudaSuccess;
    }
  }
  const KernelEntry k = entry_of(v);
  int max_optin = 0, sms = 0, fit = 0;
  cudaError_t err = cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, max_optin);
  // The SMs' shared memory at its largest: else the driver may carve out just
  // enough for one CTA of a kernel, and a balanced CTA's PDL successor would
  // find no room beside it.
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(k.fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess && v.cluster > 8)
    err = cudaFuncSetAttribute(k.fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k.fn, 32 * v.warps, smem_bytes);
  if (err != cudaSuccess) return err;
  *r = {std::max(sms, 1), std::min(std::max(fit, 1), 255)};
  if (device < kMaxDevices)
    cache[idx][device][sliding].store(r->sms << 8 | r->per_sm, std::memory_order_relaxed);
  return cudaSuccess;
}

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Split kernels without a window pad their shared memory so that at
// most 8 / warps CTAs share an SM: with PDL the next grid's CTAs launch while
// this one drains and would otherwise pile onto the first SMs to free up.
int split_smem_bytes(const Variant& v, int smem_bytes, bool sliding) {
  if (sliding || v.kind == KernelKind::kWarpPerHead || v.kind == KernelKind::kBalanced)
    return smem_bytes;
  const int ctas_per_sm = std::max(1, 8 / v.warps);
  return std::max(smem_bytes, hopper::kSmemPerSm / (ctas_per_sm + 1) + 1);
}

std::string describe(const LaunchPlan& p) {
  const char* kinds[] = {"balanced", "split", "cluster", "warp-per-head"};
  return std::string(kinds[static_cast<int>(p.kind)]) +
         (p.kv == KvDtype::kBf16 ? " bf16" : " fp8") + ", warps " + std::to_string(p.warps) +
         ", stages " + std::to_string(p.stages) +
         (p.kind == KernelKind::kCluster ? ", cluster of " + std::to_string(p.splits) : "");
}

// Pairs (request, kv head) each warp of the warp-per-head kernel takes: as few
// as its resident warps allow.
int64_t pairs_per_warp(int64_t num_pairs, const Residency& res, int warps) {
  const int64_t warp_slots = int64_t(res.total()) * warps;
  return (num_pairs + warp_slots - 1) / warp_slots;
}

}  // namespace

// Split kernels' rules (docs/design.md); an fp8 page is half a bf16 one: twice the slots for fp8.
// Short windows over at most this many requests take the cluster kernel.
constexpr int kClusterMaxBatch = 2;

LaunchPlan split_kernels_plan(int batch, int tiles, bool short_window, KvDtype kv,
                              int num_sms) {
  const int num_bh = batch * tiles;
  const int slots = kv == KvDtype::kBf16 ? 1 : 2;  // ring slots per bf16 one
  auto at_least_1 = [](int x) { return x < 1 ? 1 : x; };
  using K = KernelKind;
  using R = Refill;
  if (short_window) {
    if (batch <= kClusterMaxBatch)
      return {.kind = K::kCluster, .kv = kv, .warps = 4, .stages = 2 * slots, .splits = 4,
              .min_pages = 1, .refill = R::kBeforeWait};
    if (num_bh >= 3 * num_sms)
      return {.kind = K::kWarpPerHead, .kv = kv, .warps = 4, .stages = 3 * slots, .splits = 0,
              .min_pages = 1, .refill = R::kKernelRule};
    if (batch <= 16)
      return {.kind = K::kSplit, .kv = kv, .warps = 4, .stages = 2 * slots, .splits = 1,
              .min_pages = 2, .refill = R::kBeforeWait};
    return {.kind = K::kSplit, .kv = kv, .warps = 4, .stages = (batch <= 64 ? 3 : 2) * slots,
            .splits = 1, .min_pages = 1, .refill = R::kBeforeWait};
  }
  if (num_bh <= 8)
    return {.kind = K::kSplit, .kv = kv, .warps = 9, .stages = 2 * slots,
            .splits = at_least_1(num_sms / num_bh), .min_pages = batch <= 2 ? 1 : 4,
            .refill = R::kAfterUnlessLate};
  if (batch <= 2)
    return {.kind = K::kSplit, .kv = kv, .warps = 8, .stages = 2 * slots,
            .splits = at_least_1(2 * num_sms / num_bh), .min_pages = 1, .refill = R::kAfterWait};
  if (batch <= 4)
    return {.kind = K::kSplit, .kv = kv, .warps = 8, .stages = 2 * slots,
            .splits = at_least_1(num_sms / num_bh), .min_pages = 2, .refill = R::kAfterWait};
  return {.kind = K::kSplit, .kv = kv, .warps = 4, .stages = 3 * slots,
          .splits = at_least_1(2 * num_sms / num_bh), .min_pages = 2, .refill = R::kBeforeWait};
}

// Balanced (a few us more a call) from 8 requests where < 8 split CTAs a pair miss ragged lengths.
constexpr int kBalancedMinBatch = 8;
constexpr int kSplitMinCtasPerPair = 8;

// <= 8 pages a warp (4 if < SMs/4 CTAs): past that, a grid of one CTA a pair leaves SMs idle.
bool short_window(int window, int batch, int tiles, int num_sms) {
  if (window <= 0) return false;
  const bool cluster = batch <= kClusterMaxBatch;
  const int64_t span_pages = ceil_div(window, kPageTokens);
  const int64_t ctas = int64_t(cluster ? 4 : 1) * batch * tiles;
  const int warps_per_pair = cluster ? 16 : 4;
  const int pages_per_warp = 4 * ctas >= num_sms ? 8 : 4;
  return span_pages <= int64_t(pages_per_warp) * warps_per_pair;
}

LaunchPlan plan_launch(int batch, int tiles, int window, KvDtype kv, int num_sms) {
  const int64_t pairs = int64_t(batch) * tiles;
  const int64_t split_max_pairs = std::max(8, 2 * num_sms / kSplitMinCtasPerPair);
  const bool balanced = window <= 0 && batch >= kBalancedMinBatch && pairs > split_max_pairs;
  if (!balanced)
    return split_kernels_plan(batch, tiles,
                              short_window(window, batch, tiles, num_sms), kv, num_sms);
  // 8 warps of 2 x 8 KB (bf16) or 4 x 4 KB (fp8) slots: the bytes in flight an SM's intake needs.
  return {.kind = KernelKind::kBalanced, .kv = kv, .warps = 8,
          .stages = kv == KvDtype::kBf16 ? 2 : 4, .refill = Refill::kKernelRule};
}

std::string check_plan(const LaunchPlan& plan) {
  if (find_variant(plan) == nullptr) {
    std::string have;
    for (int i = 0; i < kNumVariants; ++i) have += " (" + describe(variant_plan(i)) + ")";
    return "no compiled kernel for " + describe(plan) + "; compiled:" + have;
  }
  if ((plan.kind == KernelKind::kSplit || plan.kind == KernelKind::kCluster) &&
      (plan.splits < 1 || plan.min_pages < 1))
    return "a split plan needs splits >= 1 and min_pages >= 1, got " + std::to_string(plan.splits) +
           " and " + std::to_string(plan.min_pages);
  return {};
}

int num_variants() { return kNumVariants; }

LaunchPlan variant_plan(int i) {
  const Variant& v = kVariants[i];
  return {.kind = v.kind,
          .kv = v.kv,
          .warps = v.warps,
          .stages = v.stages,
          .splits = v.kind == KernelKind::kCluster ? v.cluster
                    : v.kind == KernelKind::kSplit ? 4
                                                   : 0,
          .refill = v.kind == KernelKind::kBalanced ? Refill::kKernelRule : Refill::kBeforeWait};
}

namespace {

// The shape of a launch, and the residency of its kernel.
cudaError_t shape_of(const DecodeParams& p, const LaunchPlan& plan, int device, LaunchShape* shape,
                     Residency* res) {
  const Variant& v = *find_variant(plan);
  const bool sliding = p.window > 0;
  const int smem = split_smem_bytes(v, entry_of(v).smem_bytes, sliding);
  cudaError_t err = prepare(v, device, smem, sliding, res);
  if (err != cudaSuccess) return err;
  const int64_t num_pairs = int64_t(p.batch) * p.tiles;
  shape->block = dim3(32 * plan.warps);
  shape->smem_bytes = smem;
  shape->max_active_splits =
      static_cast<int>(std::max<int64_t>(1, res->total() / std::max<int64_t>(num_pairs, 1)));
  switch (plan.kind) {
    case KernelKind::kBalanced: {
      // Persistent: half the CTAs an SM holds (at least one), so that a PDL
      // successor's CTAs fit beside this call's; the kernel divides the
      // pages among its warps.
      const int grid = plan.ctas > 0 ? plan.ctas : res->sms * std::max(1, res->per_sm / 2);
      shape->grid = dim3(grid);
      shape->partials = 4 * int64_t(grid);
      shape->counters = 4 * int64_t(grid);
      break;
    }
    case KernelKind::kWarpPerHead: {
      // At least one CTA per SM where there are as many pairs: the kernel
      // spreads the pairs over the CTAs (c, c + grid, ...), so every SM streams.
      const int64_t per_warp = pairs_per_warp(num_pairs, *res, plan.warps);
      const int64_t fill = std::min<int64_t>(num_pairs, res->sms);
      shape->grid = dim3(std::max<int64_t>(ceil_div(num_pairs, plan.warps * per_warp), fill));
      shape->partials = shape->counters = 0;
      break;
    }
    default: {
      // Split kernels past one split: a partial row per CTA; counters per
      // (pair, merge warp), then per (row, merge warp) for a two-level
      // merge's groups. One split, or a cluster, merges through neither.
      const int64_t rows =
          plan.kind == KernelKind::kSplit && plan.splits > 1 ? num_pairs * plan.splits : 0;
      shape->grid = dim3(plan.splits, p.tiles, p.batch);
      shape->partials = rows;
      shape->counters = rows > 0 ? (num_pairs + rows) * 8 : 0;
    }
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_shape(const DecodeParams& p, const LaunchPlan& plan, int device,
                         LaunchShape* shape) {
  Residency res{};
  return shape_of(p, plan, device, shape, &res);
}

cudaError_t encode_kv_map(DecodeParams& p) {
  if (p.kv_dtype != KvDtype::kFp8E4m3 || p.num_blocks == 0) return cudaSuccess;
  // The driver's encoder through the runtime, so the extension does not link libcuda.
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                             cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  // Innermost first: a token's 256 bytes, the page's 16 tokens, kv heads,
  // blocks (fp8 strides are bytes). A box is one half of a page: K (c0 = 0)
  // or V (c0 = 128), 16 rows of 128 bytes. No L2 promotion: the two boxes
  // then read each line once, as the bf16 bulk copies do (promoting a K box's
  // lines to 256 bytes fetches the V half twice).
  const cuuint64_t dims[4] = {cuuint64_t(kRowElems), cuuint64_t(kPageTokens),
                              cuuint64_t(p.num_kv_heads), cuuint64_t(p.num_blocks)};
  // A dim of size 1 may carry any stride (a view's); give the encoder one it
  // takes (a multiple of 16 below 2^40).
  const int64_t head_stride = p.num_kv_heads == 1 ? kPageTokens * kRowElems : p.kv_stride_head;
  const int64_t block_stride = p.num_blocks == 1 ? head_stride * p.num_kv_heads : p.kv_stride_block;
  const cuuint64_t strides[3] = {cuuint64_t(kRowElems), cuuint64_t(head_stride),
                                 cuuint64_t(block_stride)};
  const cuuint32_t box[4] = {cuuint32_t(kHeadDim), cuuint32_t(kPageTokens), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  static_assert(sizeof(map) == sizeof(p.kv_map), "KvTensorMap holds a CUtensorMap");
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(p.kv_cache),
                            dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  std::memcpy(&p.kv_map, &map, sizeof(map));
  return cudaSuccess;
}

cudaError_t launch_decode_attention(const DecodeParams& params, const LaunchPlan& plan,
                                    cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  LaunchShape shape{};
  Residency res{};
  if (err == cudaSuccess) err = shape_of(params, plan, device, &shape, &res);
  if (err != cudaSuccess) return err;
  DecodeParams p = params;
  err = encode_kv_map(p);
  if (err != cudaSuccess) return err;
  p.refill = plan.refill;
  if (plan.kind != KernelKind::kBalanced) {
    const int num_pairs = p.batch * p.tiles;
    p.min_pages = plan.min_pages;
    p.max_active_splits = shape.max_active_splits;
    if (plan.kind == KernelKind::kWarpPerHead && p.refill == Refill::kKernelRule)
      p.refill = pairs_per_warp(num_pairs, res, plan.warps) >= 2 ? Refill::kAfterWait
                                                                 : Refill::kBeforeWait;
  }
  cudaLaunchConfig_t launch = {};
  launch.gridDim = shape.grid;
  launch.blockDim = shape.block;
  launch.dynamicSmemBytes = shape.smem_bytes;
  launch.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (plan.pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (plan.kind == KernelKind::kCluster) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = plan.splits;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  launch.attrs = attrs;
  launch.numAttrs = n;
  void* args[] = {&p};
  return cudaLaunchKernelExC(&launch, entry_of(*find_variant(plan)).fn, args);
}

}  // namespace flint
