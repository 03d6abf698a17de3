// flint_attention._testing: test-only ops (torch.ops.flint_testing), a second
// extension that tests and benchmarks load and the operator never does. It
// links to flint_attention._C and drives its launch plans explicitly.
//
// A plan travels as int[9]: kind, kv dtype, warps, stages, splits, min_pages,
// refill (Refill, -1..2), pdl, ctas (decode_attention/launch_plan.h;
// python/flint_attention/testing/plans.py names them).
#include <Python.h>

#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "decode_attention/division.h"
#include "decode_attention/launch_plan.h"
#include "ops/decode_attention_cuda.h"
#include "ops/params_from_tensors.h"

namespace flint {
namespace {

constexpr int kPlanInts = 9;

std::vector<int64_t> to_ints(const LaunchPlan& p) {
  return {static_cast<int64_t>(p.kind), static_cast<int64_t>(p.kv), p.warps, p.stages, p.splits,
          p.min_pages, static_cast<int64_t>(p.refill), p.pdl ? 1 : 0, p.ctas};
}

LaunchPlan from_ints(c10::IntArrayRef v) {
  TORCH_CHECK(v.size() == kPlanInts, "flint_testing: a plan is ", kPlanInts, " ints, got ",
              v.size());
  TORCH_CHECK(v[0] >= 0 && v[0] <= 3 && (v[1] == 0 || v[1] == 1) && v[6] >= -1 && v[6] <= 2,
              "flint_testing: plan kind must be 0..3, kv dtype 0 or 1 and refill -1..2, got ", v);
  return {.kind = static_cast<KernelKind>(v[0]),
          .kv = static_cast<KvDtype>(v[1]),
          .warps = static_cast<int>(v[2]),
          .stages = static_cast<int>(v[3]),
          .splits = static_cast<int>(v[4]),
          .min_pages = static_cast<int>(v[5]),
          .refill = static_cast<Refill>(v[6]),
          .pdl = v[7] != 0,
          .ctas = static_cast<int>(v[8])};
}

void decode_attention_with_plan(const at::Tensor& q, const at::Tensor& kv_cache,
                                const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                const std::optional<at::Tensor>& sinks,
                                std::optional<int64_t> window, double scale, const at::Tensor& out,
                                const std::optional<at::Tensor>& k_scale,
                                const std::optional<at::Tensor>& v_scale,
                                const std::optional<at::Tensor>& lse, c10::IntArrayRef plan) {
  const LaunchPlan p = from_ints(plan);
  decode_attention_cuda_launch(
      {q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, k_scale, v_scale, lse}, &p);
}

std::vector<int64_t> default_plan_op(const at::Tensor& q, const at::Tensor& kv_cache,
                                     std::optional<int64_t> window) {
  // Only what the plan reads: q's batch and device, the cache's heads and format, the window.
  const std::optional<at::Tensor> none;
  return to_ints(default_plan({q, kv_cache, q, q, none, window, 1.0, q, none, none, none}));
}

// The shape of a call as the plan sees it: batch, kv heads, window, query
// tokens, group and the row tiles they make (DecodeParams::tiles).
DecodeParams call_shape(const at::Tensor& q, const at::Tensor& kv_cache,
                        std::optional<int64_t> window) {
  DecodeParams p{};
  p.batch = static_cast<int>(q.size(0));
  p.num_kv_heads = static_cast<int>(kv_cache.size(1));
  p.window = window ? static_cast<int>(std::min<int64_t>(*window, INT32_MAX)) : 0;
  p.q_tokens = q.dim() == 4 ? static_cast<int>(q.size(1)) : 1;
  p.group = static_cast<int>(q.size(-2) / kv_cache.size(1));
  set_tiles(p);
  return p;
}

// The split kernels' plan (what plan_launch picks for sliding windows and
// short full-attention calls), or with !split_rules plan_launch's own.
LaunchPlan plan_of(int batch, int kvh, int window, KvDtype kv, int sms, bool split_rules) {
  return split_rules
             ? split_kernels_plan(batch, kvh, short_window(window, batch, kvh, sms), kv, sms)
             : plan_launch(batch, kvh, window, kv, sms);
}

// The split kernels' plan for the call.
std::vector<int64_t> split_rules_plan_op(const at::Tensor& q, const at::Tensor& kv_cache,
                                         std::optional<int64_t> window) {
  const int sms = at::cuda::getDeviceProperties(q.device().index())->multiProcessorCount;
  const KvDtype kv =
      kv_cache.scalar_type() == at::kFloat8_e4m3fn ? KvDtype::kFp8E4m3 : KvDtype::kBf16;
  const DecodeParams p = call_shape(q, kv_cache, window);
  return to_ints(plan_of(p.batch, p.tiles, window_tokens(window), kv, sms, true));
}

// The plan of a call of this shape on a GPU of `sms` SMs (kv 0: bf16, 1:
// fp8; window 0: none): plan_launch's, or with `split_rules` the split kernels'.
// No tensor and no GPU: the launch plan's rules checked over many shapes and
// SM counts on any machine (tests/test_launch_plan.py).
std::vector<int64_t> plan_for_shape_op(int64_t batch, int64_t num_kv_heads, int64_t window,
                                       int64_t kv, int64_t sms, bool split_rules) {
  TORCH_CHECK(batch >= 1 && num_kv_heads >= 1 && batch * num_kv_heads <= INT32_MAX &&
                  window >= 0 && (kv == 0 || kv == 1) && sms >= 1 && sms <= 1024,
              "flint_testing.plan_for_shape: batch, num_kv_heads >= 1 (their product an int32), "
              "window >= 0, kv 0 or 1, 1 <= sms <= 1024; got ", batch, ", ", num_kv_heads, ", ",
              window, ", ", kv, ", ", sms);
  return to_ints(plan_of(static_cast<int>(batch), static_cast<int>(num_kv_heads),
                         window_tokens(window), static_cast<KvDtype>(kv), static_cast<int>(sms),
                         split_rules));
}

int64_t num_variants_op() { return num_variants(); }

std::vector<int64_t> variant_op(int64_t i) {
  TORCH_CHECK(i >= 0 && i < num_variants(), "flint_testing: variant ", i, " of ", num_variants());
  return to_ints(variant_plan(static_cast<int>(i)));
}

// The launch shape of `plan` for a call of q's batch and kv_cache's kv heads
// on q's device; p gets the call's batch, kv heads and window.
LaunchShape shape_of_call(const at::Tensor& q, const at::Tensor& kv_cache,
                          std::optional<int64_t> window, const LaunchPlan& plan, DecodeParams& p) {
  const c10::cuda::CUDAGuard guard(q.device());
  p = call_shape(q, kv_cache, window);
  LaunchShape shape{};
  C10_CUDA_CHECK(launch_shape(p, plan, q.device().index(), &shape));
  return shape;
}

// Where the pages of a call go under a balanced plan: [ctas, units of the
// busiest CTA, total units, units per warp, units per CTA, a segment's units
// besides its pages] (division.h: a unit is a page or part of a piece's fixed
// cost), from the lengths and the grid the plan launches on q's device.
std::vector<int64_t> division_op(const at::Tensor& q, const at::Tensor& kv_cache,
                                 const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                 std::optional<int64_t> window, c10::IntArrayRef plan_ints) {
  const LaunchPlan plan = from_ints(plan_ints);
  TORCH_CHECK(plan.kind == KernelKind::kBalanced, "flint_testing.division: a balanced plan");
  DecodeParams p{};
  const LaunchShape shape = shape_of_call(q, kv_cache, window, plan, p);
  const at::Tensor lens = seq_lens.to(at::kCPU).contiguous();
  int64_t total = 0;
  const int max_blocks = static_cast<int>(block_tables.size(1));
  const int cost = piece_cost_units(plan.kv);
  for (int64_t b = 0; b < lens.size(0); ++b)
    total += segment_units(seq_extent(lens.data_ptr<int32_t>()[b], p.window, p.q_tokens, max_blocks).num_pages,
                           cost);
  total *= p.tiles;
  const Division d = divide_pages(total, static_cast<int>(shape.grid.x), plan.warps,
                                  plan.stages - 1);
  return {shape.grid.x, std::min(d.cta_pages, total), total, d.per_warp, d.cta_pages, cost};
}

// The attended pages each CTA of a split, cluster or warp-per-head launch
// streams, CTA by CTA in the grid's order (x fastest): the division those
// kernels make on the device (kernel_split.cuh, kernel_warp_per_head.cuh), redone
// here from the same formulas (division.h) for the benchmark's balance.
std::vector<int64_t> cta_pages_op(const at::Tensor& q, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                  std::optional<int64_t> window, c10::IntArrayRef plan_ints) {
  const LaunchPlan plan = from_ints(plan_ints);
  TORCH_CHECK(plan.kind != KernelKind::kBalanced,
              "flint_testing.cta_pages: a split, cluster or warp-per-head plan (division for the "
              "balanced kernel)");
  const std::string bad = check_plan(plan);
  TORCH_CHECK(bad.empty(), "flint_testing.cta_pages: ", bad);
  DecodeParams p{};
  const LaunchShape shape = shape_of_call(q, kv_cache, window, plan, p);
  const at::Tensor lens = seq_lens.to(at::kCPU).contiguous();
  TORCH_CHECK(lens.size(0) == p.batch, "flint_testing.cta_pages: one length a request");
  const int max_blocks = static_cast<int>(block_tables.size(1));
  std::vector<int> pages(p.batch);
  int total = 0;
  for (int b = 0; b < p.batch; ++b) {
    pages[b] = std::max(seq_extent(lens.data_ptr<int32_t>()[b], p.window, p.q_tokens, max_blocks).num_pages, 0);
    total += pages[b];
  }
  const int64_t grid = int64_t(shape.grid.x) * shape.grid.y * shape.grid.z;
  std::vector<int64_t> out(grid, 0);
  if (plan.kind == KernelKind::kWarpPerHead) {
    // Warp w of CTA c: pairs c + (w + i x warps) x grid.
    const int64_t pairs = int64_t(p.batch) * p.tiles;
    for (int64_t pair = 0; pair < pairs; ++pair)
      out[pair % grid] += pages[pair / p.tiles];
    return out;
  }
  // Split and cluster kernels: grid (splits, kv heads, batch); every kv head
  // divides alike. A kv head's CTA f = b x max_splits + split: with cta_share
  // (split kernels past one split) request b's CTAs are the next
  // request_ctas from f = 0 on, else its own max_splits.
  const int max_splits = static_cast<int>(shape.grid.x);
  const int cap0 = std::min(max_splits, shape.max_active_splits);
  const bool shared = plan.kind == KernelKind::kSplit && max_splits > 1;
  const int64_t spare = int64_t(cap0) * p.batch - p.batch;
  std::vector<int64_t> head(int64_t(max_splits) * p.batch, 0);
  int64_t first = 0;  // request b's first CTA
  for (int b = 0; b < p.batch; ++b) {
    const int ctas = shared ? request_ctas(spare, pages[b], total) : max_splits;
    const int64_t at = shared ? first : int64_t(b) * max_splits;
    first += ctas;
    if (pages[b] <= 0) continue;
    const SplitStreams st =
        plan.kind == KernelKind::kSplit
            ? split_streams(pages[b], plan.warps, std::min(plan.warps, 8), shared ? ctas : cap0,
                            plan.min_pages)
            : SplitStreams{max_splits, plan.warps};
    for (int split = 0; split < std::min(ctas, st.splits); ++split)
      for (int w = 0; w < st.warps; ++w)
        head[at + split] += interleaved_pages(pages[b], split * st.warps + w, st.splits * st.warps);
  }
  for (int u = 0; u < p.tiles; ++u)
    for (size_t f = 0; f < head.size(); ++f) {
      const int64_t b = int64_t(f) / max_splits, x = int64_t(f) % max_splits;
      out[(b * p.tiles + u) * max_splits + x] = head[f];
    }
  return out;
}

}  // namespace

// Defined in pdl_writer.cu.
void pdl_token_writer(const at::Tensor& src_q, const at::Tensor& q, const at::Tensor& src_kv,
                      const at::Tensor& kv_cache, const at::Tensor& block, const at::Tensor& row,
                      int64_t delay_ns);
// Defined in balanced_phases.cu.
void balanced_phases(const at::Tensor& q, const at::Tensor& kv_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                     const at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                     const std::optional<at::Tensor>& v_scale, const at::Tensor& stamps);
// Defined in split_phases.cu.
void split_phases(const at::Tensor& q, const at::Tensor& kv_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                  const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                  const at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                  const std::optional<at::Tensor>& v_scale, const at::Tensor& stamps,
                  const LaunchPlan& plan);

namespace {

void split_phases_op(const at::Tensor& q, const at::Tensor& kv_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const at::Tensor& sinks, std::optional<int64_t> window, double scale,
                     const at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                     const std::optional<at::Tensor>& v_scale, const at::Tensor& stamps,
                     c10::IntArrayRef plan) {
  split_phases(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, k_scale, v_scale,
               stamps, from_ints(plan));
}

}  // namespace

TORCH_LIBRARY(flint_testing, m) {
  // A PDL-aware stand-in for a KV-cache writer right before decode_attention
  // (pdl_writer.cu, tests/test_pdl.py).
  m.def("pdl_token_writer(Tensor src_q, Tensor(a!) q, Tensor src_kv, Tensor(b!) kv_cache, "
        "Tensor block, Tensor row, int delay_ns) -> ()");
  // decode_attention launched with an explicit plan (A/B runs, variant tests).
  m.def("decode_attention_with_plan(Tensor q, Tensor kv_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor? sinks, int? window, float scale, Tensor(a!) out, "
        "Tensor? k_scale, Tensor? v_scale, Tensor(b!)? lse, int[] plan) -> ()");
  m.def("default_plan(Tensor q, Tensor kv_cache, int? window) -> int[]");
  m.def("split_rules_plan(Tensor q, Tensor kv_cache, int? window) -> int[]");
  m.def("plan_for_shape(int batch, int num_kv_heads, int window, int kv, int sms, "
        "bool split_rules) -> int[]", &plan_for_shape_op);
  m.def("num_variants() -> int", &num_variants_op);
  m.def("variant(int i) -> int[]", &variant_op);
  m.def("division(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, int? window, "
        "int[] plan) -> int[]");
  m.def("cta_pages(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, int? window, "
        "int[] plan) -> int[]");
  // The balanced kernel with %globaltimer stamps at its phases (balanced_phases.cu).
  m.def("balanced_phases(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
        "Tensor sinks, int? window, float scale, Tensor(a!) out, Tensor? k_scale, "
        "Tensor? v_scale, Tensor(b!) stamps) -> ()");
  // The 9-warp split kernel with %globaltimer stamps at its phases (split_phases.cu).
  m.def("split_phases(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
        "Tensor sinks, int? window, float scale, Tensor(a!) out, Tensor? k_scale, "
        "Tensor? v_scale, Tensor(b!) stamps, int[] plan) -> ()");
}

TORCH_LIBRARY_IMPL(flint_testing, CUDA, m) {
  m.impl("pdl_token_writer", &pdl_token_writer);
  m.impl("decode_attention_with_plan", &decode_attention_with_plan);
  m.impl("default_plan", &default_plan_op);
  m.impl("split_rules_plan", &split_rules_plan_op);
  m.impl("division", &division_op);
  m.impl("cta_pages", &cta_pages_op);
  m.impl("balanced_phases", &balanced_phases);
  m.impl("split_phases", &split_phases_op);
}

}  // namespace flint

// `import flint_attention._testing` loads this library (and so runs the
// registrations above).
extern "C" PyObject* PyInit__testing(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_testing", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
