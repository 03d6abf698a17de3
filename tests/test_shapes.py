"""Every shape the op takes: 1 to 16 query heads per kv head, head dims 64,
128 and 256, 1 to 8 query tokens per request, sinks or none, and the
log-sum-exp output, against the float64 reference with NaN/Inf in every
unattended cache slot and NaN in every output before the call.

A head_dim the CUDA kernels of this build are not compiled for raises a
clear error on a GPU (test_cuda_refuses_what_it_does_not_serve); everything
else runs on each device the ``device`` fixture gives.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import check_output, needs_hopper, reference, run_op

from flint_attention import flint_decode_attention
from flint_attention.ops import GQA, HEAD_DIM, HEAD_DIMS, MAX_GROUP, MAX_QUERY_TOKENS
from flint_attention.testing import FP8, make_paged_inputs

KV_DTYPES = {"bf16": torch.bfloat16, "fp8": FP8}

# The log-sum-exp is float32 in the op (exp2, log2 and one fma from the
# scaled logits); against float64 it is off by a few float32 ulps of the
# logits' magnitude (|s| < ~40 here), far below this bound.
LSE_ATOL = 1e-4


def kernel_serves(group: int, head_dim: int, q_tokens: int | None, sinks: bool, lse: bool) -> bool:
    """Whether the CUDA kernels of this build are compiled for the call: one
    head_dim; every group, query-token count, sinks and lse."""
    return head_dim == HEAD_DIM


def skip_unserved_cuda(device, *shape) -> None:
    if device == "cuda" and not kernel_serves(*shape):
        pytest.skip(f"the CUDA kernels of this build serve head_dim {HEAD_DIM}")


def random_lens(rng: random.Random, batch: int, longest: int) -> list[int]:
    """Ragged lengths with a padding row (0) and a one-token request."""
    lens = [rng.randint(1, longest) for _ in range(batch)]
    lens[0] = 0
    if batch > 2:
        lens[1] = 1
    return lens


def check_lse(lse: torch.Tensor, ref_lse: torch.Tensor, what: str) -> None:
    lse, ref_lse = lse.double().cpu(), ref_lse.cpu()
    same_inf = (lse == ref_lse) | (lse - ref_lse).abs().le(LSE_ATOL + 1e-6 * ref_lse.abs())
    assert not lse.isnan().any(), f"lse NaN where no NaN was given: {what}"
    assert same_inf.all(), f"lse off by {(lse - ref_lse).abs().nan_to_num(math.inf).max():.3g}: {what}"


@pytest.mark.parametrize("kv", list(KV_DTYPES))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("group", range(1, MAX_GROUP + 1))
def test_every_group_and_head_dim(device, group, head_dim, kv):
    # Sinks, window and kv head count rotate over the cases, so that each
    # group and head dim meets each of them across the two formats.
    case = group + head_dim // 64 + (kv == "fp8")
    sinks, window, kvh = case % 2 == 0, (None, 37, 16, 1)[case % 4], 1 + case % 3
    skip_unserved_cuda(device, group, head_dim, None, sinks, False)
    rng = random.Random()
    inp = make_paged_inputs(
        5, random_lens(rng, 5, 150), kvh, window, device, group=group, head_dim=head_dim,
        kv_dtype=KV_DTYPES[kv], with_sinks=sinks, strided_cache=case % 3 == 0, strided_io=case % 5 == 0,
    )
    out = run_op(inp, window, head_dim**-0.5)
    check_output(out, inp, window, head_dim**-0.5, f"group {group} head_dim {head_dim} {kv} sinks {sinks}")


@pytest.mark.parametrize("kv", list(KV_DTYPES))
@pytest.mark.parametrize("q_tokens", range(1, MAX_QUERY_TOKENS + 1))
def test_query_tokens_and_lse(device, q_tokens, kv):
    # Requests shorter than the query tokens: the tokens before position 0
    # attend to nothing (zeros, an lse of the sink).
    rng = random.Random()
    group, head_dim = rng.choice([(1, 64), (4, 128), (5, 128), (8, 64), (16, 128), (6, 256), (12, 128)])
    window = rng.choice([None, 1, 9, 40])
    sinks = rng.random() < 0.5
    skip_unserved_cuda(device, group, head_dim, q_tokens, sinks, True)
    lens = random_lens(rng, 6, 120)
    lens[-1] = max(q_tokens - 2, 0)
    inp = make_paged_inputs(
        6, lens, 2, window, device, group=group, head_dim=head_dim, q_tokens=q_tokens,
        kv_dtype=KV_DTYPES[kv], with_sinks=sinks, with_lse=True, strided_io=q_tokens % 2 == 0,
    )
    what = f"q_tokens {q_tokens} group {group} head_dim {head_dim} window {window} sinks {sinks} seed {inp.seed} lens {lens}"
    scale = head_dim**-0.5
    out = run_op(inp, window, scale)
    check_output(out, inp, window, scale, what)
    _, ref_lse = reference(inp, window, scale, return_lse=True)
    check_lse(inp.lse, ref_lse, what)


def test_tokens_are_rows_apart(device):
    # Q query tokens in one call give, bit for bit, what Q one-token calls
    # give, each with the request cut at its token: a row tile holds several
    # tokens, but no token sees another's positions.
    group, head_dim, q_tokens, window = 4, 128, 5, 21
    skip_unserved_cuda(device, group, head_dim, q_tokens, True, True)
    lens = [0, 3, 17, 64, 130]
    inp = make_paged_inputs(5, lens, 2, window, device, group=group, head_dim=head_dim, q_tokens=q_tokens, with_lse=True)
    run_op(inp, window, 0.1)
    for i in range(q_tokens):
        cut = torch.clamp(inp.seq_lens - (q_tokens - 1 - i), min=0).to(torch.int32)
        out = torch.full_like(inp.out[:, i], math.nan)
        lse = torch.full_like(inp.lse[:, i], math.nan)
        q = inp.q[:, i]
        flint_decode_attention(q, inp.kv_cache, inp.block_tables, cut, inp.sinks, window, 0.1, out, lse=lse)
        # Rows whose token sits before position 0 write zeros either way.
        assert torch.equal(out, inp.out[:, i]), f"token {i}"
        assert torch.equal(lse, inp.lse[:, i]), f"token {i}"


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_no_sinks_is_a_sink_of_minus_inf(device, head_dim):
    skip_unserved_cuda(device, GQA, head_dim, None, False, False)
    inp = make_paged_inputs(3, [0, 20, 77], 2, None, device, head_dim=head_dim, with_sinks=False)
    out = run_op(inp, None, 0.1).clone()
    with_inf = torch.full((2 * GQA,), -math.inf, device=device)
    again = torch.full_like(out, math.nan)
    flint_decode_attention(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, with_inf, None, 0.1, again)
    assert torch.equal(out, again)


def test_lse_of_empty_and_sink_only_rows():
    # No position: lse is the sink (or -inf without sinks) and out is 0.
    inp = make_paged_inputs(2, [0, 0], 1, None, group=2, with_lse=True)
    run_op(inp, None)
    assert torch.equal(inp.out, torch.zeros_like(inp.out))
    assert torch.equal(inp.lse, inp.sinks.expand(2, 2))
    inp = make_paged_inputs(2, [0, 0], 1, None, group=2, with_lse=True, with_sinks=False)
    run_op(inp, None)
    assert torch.equal(inp.lse, torch.full((2, 2), -math.inf))


def test_lse_merges_context_shards():
    # Context-parallel decode: the context split in two shards (the first two
    # pages, the rest), the sinks given to one, merged with their lse, is the
    # unsharded attention.
    group, head_dim = 4, 64
    inp = make_paged_inputs(3, [50, 77, 200], 2, None, group=group, head_dim=head_dim, with_lse=True)
    shards = (
        (torch.full_like(inp.seq_lens, 32), inp.block_tables, inp.sinks),
        (inp.seq_lens - 32, inp.block_tables[:, 2:].contiguous(), None),
    )
    outs, lses = [], []
    for seq_lens, table, sinks in shards:
        out, lse = torch.empty_like(inp.out), torch.empty_like(inp.lse)
        flint_decode_attention(inp.q, inp.kv_cache, table, seq_lens, sinks, None, 0.125, out, lse=lse)
        outs.append(out.double())
        lses.append(lse.double())
    lse = torch.logaddexp(*lses)
    merged = sum(torch.exp(x - lse)[..., None] * o for x, o in zip(lses, outs))
    ref, ref_lse = reference(inp, None, 0.125, return_lse=True)
    check_lse(lse, ref_lse, "merged shards")
    assert (merged - ref).abs().max() < 2**-7, "merged shards vs float64"


@needs_hopper
@pytest.mark.parametrize("shape", [dict(head_dim=64), dict(head_dim=256, q_tokens=2)], ids=["d64", "d256_q2"])
def test_cuda_refuses_what_it_does_not_serve(shape):
    inp = make_paged_inputs(2, [5, 20], 1, None, "cuda", **shape)
    with pytest.raises(RuntimeError, match="the CUDA kernels of this build serve head_dim 128"):
        run_op(inp, None)
    assert inp.out.isnan().all(), "nothing written"
