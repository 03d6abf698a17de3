"""Programmatic dependent launch (PDL): a preceding kernel
(flint_testing::pdl_token_writer) triggers its dependents at once, sleeps,
then writes q and the current token's K/V; the decode kernel launched right
behind it must see the new values every time, eagerly and inside a CUDA
graph, with a bf16 and an fp8 cache. A kernel that read q or the current page
before griddepcontrol.wait shows a moving error here.

That griddepcontrol really is in the compiled kernels is checked without a GPU
(tests/test_packaging.py).
"""

import pytest
import torch
from conftest import check_vs_f64 as check
from conftest import needs_hopper

import flint_attention
from flint_attention.testing import FP8, make_paged_inputs
from flint_attention.testing import reference_decode_attention as reference

pytestmark = needs_hopper
SCALE = 128**-0.5
KV_DTYPES = [torch.bfloat16, FP8]


def _writer():
    import flint_attention._testing  # noqa: F401

    return torch.ops.flint_testing.pdl_token_writer


def _chain_inputs(batch, num_kv_heads, kv_dtype):
    seq_lens = [int(x) for x in torch.randint(40, 3000, (batch,))]
    seq_lens[0] = 17
    # Room for 64 more tokens per request in its block table; every slot
    # readable (no poison: the chain attends to slots it writes itself).
    fp8 = dict(k_scale=[0.02] * num_kv_heads, v_scale=0.03) if kv_dtype == FP8 else {}
    inp = make_paged_inputs(batch, [n + 64 for n in seq_lens], num_kv_heads, None, "cuda",
                            poison=False, kv_dtype=kv_dtype, **fp8)
    inp.seq_lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))
    return inp


def _new_rows(batch, num_kv_heads, kv_dtype):
    rows = torch.randn(batch, num_kv_heads, 256, device="cuda") * 3
    return rows.clamp(-400, 400).to(kv_dtype) if kv_dtype == FP8 else rows.to(torch.bfloat16)


def _advance(bt, sl, q_tokens=1):
    """The next q_tokens tokens of every request: seq_len + q_tokens and
    their (block, row) slots, request-major."""
    sl += q_tokens
    pos = (sl[:, None] - q_tokens + torch.arange(q_tokens, device=sl.device)).long()
    block = bt.gather(1, pos // 16).reshape(-1).contiguous()
    row = (pos % 16).to(torch.int32).reshape(-1).contiguous()
    return block, row


def _decode(inp, window):
    return flint_attention.flint_decode_attention(
        inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, window, SCALE, inp.out,
        k_scale=inp.k_scale, v_scale=inp.v_scale)


def _check(inp, window):
    check(inp.out, reference(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, window,
                             SCALE, inp.k_scale, inp.v_scale))


def _write_then_decode(inp, src_q, src_kv, block, row, window):
    """The early-triggering writer, the decode right behind it, both checked."""
    torch.cuda.synchronize()
    _writer()(src_q, inp.q, src_kv, inp.kv_cache, block, row, 20000)
    _decode(inp, window)
    torch.cuda.synchronize()
    assert torch.equal(inp.q, src_q)
    _check(inp, window)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("batch,num_kv_heads", [(1, 8), (4, 2), (33, 1)])
def test_pdl_chain_eager(batch, num_kv_heads, window, kv_dtype):
    inp = _chain_inputs(batch, num_kv_heads, kv_dtype)
    _decode(inp, window)
    for step in range(40):
        src_q = torch.randn_like(inp.q, dtype=torch.float32).to(torch.bfloat16)
        src_kv = _new_rows(batch, num_kv_heads, kv_dtype)
        block, row = _advance(inp.block_tables, inp.seq_lens)
        _write_then_decode(inp, src_q, src_kv, block, row, window)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("window", [None, 128])
def test_pdl_chain_in_cuda_graph(window, kv_dtype):
    batch, num_kv_heads = 3, 8
    inp = _chain_inputs(batch, num_kv_heads, kv_dtype)
    src_q = torch.empty_like(inp.q)
    src_kv = _new_rows(batch, num_kv_heads, kv_dtype)
    block = torch.zeros(batch, dtype=torch.int32, device="cuda")
    row = torch.zeros(batch, dtype=torch.int32, device="cuda")
    _decode(inp, window)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(3):  # a chain of writer -> decode pairs in one graph
                _writer()(src_q, inp.q, src_kv, inp.kv_cache, block, row, 20000)
                _decode(inp, window)
    for step in range(30):
        src_q.copy_(torch.randn_like(inp.q, dtype=torch.float32))
        src_kv.copy_(_new_rows(batch, num_kv_heads, kv_dtype))
        b_new, r_new = _advance(inp.block_tables, inp.seq_lens)
        block.copy_(b_new)
        row.copy_(r_new)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        _check(inp, window)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("q_tokens,group", [(4, 8), (3, 12)])
def test_pdl_chain_query_tokens(q_tokens, group, window, kv_dtype):
    # Speculative decoding: each step brings q_tokens new tokens per request,
    # whose K/V (up to two pages, the step straddling a page boundary every
    # few steps) the writer stores after its early trigger.
    batch, num_kv_heads = 5, 2
    seq_lens = [int(x) for x in torch.randint(20, 900, (batch,))]
    seq_lens[0] = 14  # the first steps cross the page boundary at 16
    fp8 = dict(k_scale=[0.02] * num_kv_heads, v_scale=0.03) if kv_dtype == FP8 else {}
    inp = make_paged_inputs(batch, [n + 30 * q_tokens for n in seq_lens], num_kv_heads, None, "cuda",
                            poison=False, kv_dtype=kv_dtype, group=group, q_tokens=q_tokens, **fp8)
    inp.seq_lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))
    for step in range(25):
        src_q = torch.randn_like(inp.q, dtype=torch.float32).to(torch.bfloat16)
        rows = torch.randn(batch * q_tokens, num_kv_heads, 256, device="cuda") * 3
        src_kv = rows.clamp(-400, 400).to(kv_dtype) if kv_dtype == FP8 else rows.to(torch.bfloat16)
        block, row = _advance(inp.block_tables, inp.seq_lens, q_tokens)
        _write_then_decode(inp, src_q, src_kv, block, row, window)
