"""The cluster (DSMEM) merge and programmatic dependent launch (PDL).

- The cluster merge matches the last-CTA merge and the float64 reference on
  sliding-window layers.
- A PDL chain: a preceding kernel (flint_testing::pdl_token_writer) triggers its
  dependents at once, sleeps, then writes q and the current token's K/V; the
  decode kernel launched right behind it must see the new values every time,
  eagerly and inside a CUDA graph. A kernel that read q or the current page
  before griddepcontrol.wait shows a moving error here.

That griddepcontrol really is in the compiled kernels is checked without a GPU
(tests/test_packaging.py).
"""

import pytest
import torch

import flint_attention
from conftest import needs_hopper
from conftest import check_vs_f64 as check
from conftest import cuda_inputs as make_inputs

from flint_attention.testing import reference_decode_attention as reference

pytestmark = needs_hopper
SCALE = 128**-0.5


@pytest.mark.parametrize("window", [1, 16, 128, 4096])
@pytest.mark.parametrize("batch", [1, 2, 3, 5, 16])
def test_cluster_merge_matches_global_merge(launch_config, batch, window):
    g = torch.Generator().manual_seed(batch * 1000 + window)
    seq_lens = torch.randint(1, 9000, (batch,), generator=g).tolist()
    seq_lens[-1] = 0
    if batch > 2:
        seq_lens[1] = window + 15
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, 2, window)
    ref = reference(q, kv, bt, sl, sinks, window, SCALE)
    results = {}
    pairs = [("8,4,2,1,1", "8,4,2,1,0"), ("4,4,3,1,1", "4,4,3,1,0"), ("8,8,3,1,1", "8,8,3,1,0"),
             ("16,8,2,1,1", "16,8,2,1,0")]
    for cfg in [None] + [c for pair in pairs for c in pair]:
        launch_config(cfg)
        out.fill_(float("nan"))
        torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, SCALE, out)
        torch.cuda.synchronize()
        check(out, ref)
        results[cfg] = out.clone()
    for cluster, global_merge in pairs:
        # The same pages merged along other paths (the last-CTA merge may
        # activate fewer splits): a bf16 rounding or two apart.
        a, b = results[cluster].float(), results[global_merge].float()
        bound = 2**-7 * torch.maximum(torch.ones_like(a), a.abs())
        worst = ((a - b).abs() / bound).max()
        assert worst <= 1, f"{cluster} vs {global_merge} differ by {worst:.2f} x the bound"


def _chain_inputs(batch, num_kv_heads, window):
    seq_lens = [int(x) for x in torch.randint(40, 3000, (batch,))]
    seq_lens[0] = 17
    # Room for 64 more tokens per request in its block table.
    q, kv, bt, sl, sinks, out = make_inputs([n + 64 for n in seq_lens], num_kv_heads, None)
    kv = torch.where(torch.isfinite(kv), kv, torch.zeros_like(kv))  # all slots readable
    sl.copy_(torch.tensor(seq_lens, dtype=torch.int32))
    return q, kv, bt, sl, sinks, out


def _advance(bt, sl):
    """Next token of every request: seq_len + 1 and its (block, row) slot."""
    sl += 1
    pos = (sl - 1).long()
    block = bt.gather(1, (pos // 16)[:, None])[:, 0].contiguous()
    row = (pos % 16).to(torch.int32)
    return block, row


@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("batch,num_kv_heads", [(1, 8), (4, 2), (33, 1)])
def test_pdl_chain_eager(batch, num_kv_heads, window):
    q, kv, bt, sl, sinks, out = _chain_inputs(batch, num_kv_heads, window)
    flint_attention.flint_decode_attention(q, kv, bt, sl, sinks, window, SCALE, out)
    for step in range(40):
        src_q = torch.randn_like(q, dtype=torch.float32).to(torch.bfloat16)
        src_kv = torch.randn(batch, num_kv_heads, 256, device="cuda").to(torch.bfloat16) * 3
        block, row = _advance(bt, sl)
        torch.cuda.synchronize()
        torch.ops.flint_testing.pdl_token_writer(src_q, q, src_kv, kv, block, row, 20000)
        flint_attention.flint_decode_attention(q, kv, bt, sl, sinks, window, SCALE, out)
        torch.cuda.synchronize()
        assert torch.equal(q, src_q)
        check(out, reference(q, kv, bt, sl, sinks, window, SCALE))


@pytest.mark.parametrize("window", [None, 128])
def test_pdl_chain_in_cuda_graph(window):
    batch, num_kv_heads = 3, 8
    q, kv, bt, sl, sinks, out = _chain_inputs(batch, num_kv_heads, window)
    src_q = torch.empty_like(q)
    src_kv = torch.empty(batch, num_kv_heads, 256, device="cuda", dtype=torch.bfloat16)
    block = torch.zeros(batch, dtype=torch.int32, device="cuda")
    row = torch.zeros(batch, dtype=torch.int32, device="cuda")
    flint_attention.flint_decode_attention(q, kv, bt, sl, sinks, window, SCALE, out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(3):  # a chain of writer -> decode pairs in one graph
                torch.ops.flint_testing.pdl_token_writer(src_q, q, src_kv, kv, block, row, 20000)
                flint_attention.flint_decode_attention(q, kv, bt, sl, sinks, window, SCALE, out)
    for step in range(30):
        src_q.copy_(torch.randn_like(q, dtype=torch.float32))
        src_kv.copy_(torch.randn(batch, num_kv_heads, 256, device="cuda") * 3)
        b_new, r_new = _advance(bt, sl)
        block.copy_(b_new)
        row.copy_(r_new)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        check(out, reference(q, kv, bt, sl, sinks, window, SCALE))
