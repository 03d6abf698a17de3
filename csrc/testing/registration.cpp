// Schemas of the test-only ops (torch.ops.flint_testing), declared once; the
// CUDA implementations register next to their kernels.
#include <torch/library.h>

TORCH_LIBRARY(flint_testing, m) {
  // A PDL-aware stand-in for a KV-cache writer right before decode_attention
  // (pdl_writer.cu, tests/test_pdl_cluster.py).
  m.def("pdl_token_writer(Tensor src_q, Tensor(a!) q, Tensor src_kv, Tensor(b!) kv_cache, "
        "Tensor block, Tensor row, int delay_ns) -> ()");
  // decode_attention recording its per-CTA phase timeline (decode_timeline.cpp,
  // benchmarks/timeline.py).
  m.def("decode_attention_timeline(Tensor q, Tensor kv_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor sinks, int? window, float scale, Tensor(a!) out, "
        "Tensor(b!) timeline) -> ()");
}
