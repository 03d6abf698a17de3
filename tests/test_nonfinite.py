"""NaN and infinities in the inputs, and logits that overflow float32: the rule
in docs/semantics.md (Non-finite values), held on the CPU path, the CUDA
kernel and the float64 reference alike.

Each case states the expected outputs outright (which heads or dims are NaN,
which are 0) and checks the op against the reference, which must agree on every
NaN and Inf (conftest.check_output; on the GPU also against the CPU path). On
the GPU every case runs under the op's own plan and under each kernel's
(balanced, split merge, cluster merge, one warp per (request, kv head);
flint_attention.testing.plans), since a non-finite value meets a different
merge in each; the long requests give whole pages, warps and splits nothing
but -inf logits (a warp whose running max is still -inf must give them weight
0, not 2^(-inf - -inf) = NaN: the kernels' softmax_shift).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import check_output, run_op

from flint_attention.ops import GQA, HEAD_DIM, PAGE_TOKENS
from flint_attention.testing import DEFAULT_SCALE, FP8, make_paged_inputs

NAN, INF = math.nan, math.inf
# The op's own plan, then each kernel's: balanced, split merge through the
# workspace (16 splits), cluster merge, one warp per (request, kv head).
GPU_PLANS = ["default", "balanced", "split", "cluster", "warp-per-head"]
_plan = {"name": None}  # the plan run_and_check launches (None: the op's)


@pytest.fixture
def configs(device):
    """Runs the test body once per plan (once, the CPU path, on the CPU):
    ``for _ in configs:``."""

    def each():
        for name in GPU_PLANS if device == "cuda" else [None]:
            _plan["name"] = name
            yield name
        _plan["name"] = None

    return each()


def _launch(inp, window, scale):
    """inp under the current plan (run_op for the op's own)."""
    name = _plan["name"]
    if name in (None, "default"):
        return run_op(inp, window, scale)
    from flint_attention.testing import plans

    # An fp8 page is half a bf16 one: its split kernels have twice the slots
    # (launch_plan.cpp).
    kv, x = ("fp8", 2) if inp.kv_cache.dtype == FP8 else ("bf16", 1)
    if name == "balanced":
        plan = plans.balanced_plan(inp.kv_cache)
    elif name == "split":
        plan = plans.Plan(kind="split", kv=kv, warps=8, stages=2 * x, splits=16, refill=1)
    elif name == "cluster":
        plan = plans.Plan(kind="cluster", kv=kv, warps=4, stages=2 * x, splits=4)
    else:
        plan = plans.Plan(kind="warp-per-head", kv=kv, warps=4, stages=3 * x, refill=-1)
    return plans.run_with_plan(plan, inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens,
                               inp.sinks, window, scale, inp.out, inp.k_scale, inp.v_scale)


def inputs(device, seq_lens, num_kv_heads=2, window=None, **kw):
    return make_paged_inputs(len(seq_lens), seq_lens, num_kv_heads, window, device, **kw)


def set_rows(inp, b, positions, kvh, dims, value):
    """kv_cache[position p of request b, kv head kvh, dims] = value (dims index
    the 256-wide [K | V] row), for each p in positions."""
    pos = torch.as_tensor(list(positions), device=inp.kv_cache.device)
    blocks = inp.block_tables[b].long()[pos // PAGE_TOKENS]
    inp.kv_cache[blocks, kvh, pos % PAGE_TOKENS, dims] = value


def heads(kvh):
    return slice(kvh * GQA, (kvh + 1) * GQA)


def run_and_check(inp, window=None, scale=None, what=""):
    """Runs the op on fresh (NaN-filled) out and checks it against the
    reference; returns it on the CPU."""
    kw = {} if scale is None else dict(scale=scale)
    inp.out.fill_(NAN)
    out = _launch(inp, window, DEFAULT_SCALE if scale is None else scale)
    check_output(out, inp, window, what=f"{what} plan {_plan['name']}", **kw)
    return out.float().cpu()


def all_nan(t):
    return bool(t.isnan().all())


def all_finite(t):
    return bool(t.isfinite().all())


# ---- NaN ---------------------------------------------------------------------


def test_nan_in_q_makes_that_head_nan(device, configs):
    inp = inputs(device, [3000, 40, 0])
    for b in range(3):
        inp.q[b, 3, 17] = NAN
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        assert all_nan(out[:2, 3]), "the head with a NaN in q"
        assert all_finite(out[:2, :3]) and all_finite(out[:2, 4:]), "the other heads"
        assert torch.equal(out[2], torch.zeros_like(out[2])), "seq_len 0 writes zeros"


def test_nan_sink_makes_that_head_nan(device, configs):
    inp = inputs(device, [3000, 40, 0])
    inp.sinks[10] = NAN
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        assert all_nan(out[:2, 10])
        assert all_finite(out[:2, :10]) and all_finite(out[:2, 11:])
        assert torch.equal(out[2], torch.zeros_like(out[2])), "seq_len 0 writes zeros"


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_nan_in_an_attended_key_makes_its_kv_heads_nan(device, configs, kv_dtype):
    # A key row is shared by the 8 query heads of its kv head.
    fp8 = dict(kv_dtype=FP8, k_scale=[0.01, 0.02], v_scale=0.01) if kv_dtype == "fp8" else {}
    inp = inputs(device, [3000, 40], **fp8)
    set_rows(inp, 0, [2500], 1, 70, NAN)  # request 0, kv head 1, K dim 70
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        assert all_nan(out[0, heads(1)])
        assert all_finite(out[0, heads(0)]) and all_finite(out[1])


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_nan_in_an_attended_value_makes_that_dim_nan(device, configs, kv_dtype):
    fp8 = dict(kv_dtype=FP8, k_scale=0.01, v_scale=[0.01, 0.02]) if kv_dtype == "fp8" else {}
    inp = inputs(device, [3000, 40], **fp8)
    set_rows(inp, 0, [7], 0, HEAD_DIM + 5, NAN)  # request 0, kv head 0, V dim 5
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        assert all_nan(out[0, heads(0), 5])
        rest = torch.ones_like(out, dtype=torch.bool)
        rest[0, heads(0), 5] = False
        assert all_finite(out[rest])


def test_nan_outside_the_window_is_not_read(device, configs):
    inp = inputs(device, [3000], window=128)
    set_rows(inp, 0, range(0, 3000 - 128), 0, slice(None), NAN)
    for cfg in configs:
        assert all_finite(run_and_check(inp, window=128, what=f"config {cfg}"))


# ---- infinities in V, in the sinks ------------------------------------------


@pytest.mark.parametrize("sign", [1, -1])
def test_inf_in_an_attended_value_makes_that_dim_inf(device, configs, sign):
    # Unit-variance logits give every token a weight well above bf16's
    # smallest, so the dim is +-inf exactly (NaN would need a weight of 0 or
    # infinities of both signs).
    inp = inputs(device, [3000, 40])
    set_rows(inp, 0, [1234], 1, HEAD_DIM + 100, sign * INF)
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        assert torch.equal(out[0, heads(1), 100], torch.full((GQA,), sign * INF))
        rest = torch.ones_like(out, dtype=torch.bool)
        rest[0, heads(1), 100] = False
        assert all_finite(out[rest])


def test_infinite_sinks(device, configs):
    # +inf: the sink takes all the weight, the output is 0; -inf: no sink at
    # all; a finite sink whose sink * log2(e) overflows float32 is an infinite one.
    inp = inputs(device, [3000, 40, 1])
    inp.sinks[0] = INF
    inp.sinks[1] = -INF
    inp.sinks[9] = 3e38
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))
        assert torch.equal(out[:, 9], torch.zeros_like(out[:, 9]))
        assert all_finite(out[:, 1]) and out[:, 1].abs().sum() > 0


def test_plus_inf_sink_with_a_nan_value(device, configs):
    # 0 x NaN is NaN: the sink does not mask a NaN in an attended value.
    inp = inputs(device, [300], num_kv_heads=1)
    inp.sinks.fill_(INF)
    set_rows(inp, 0, [5], 0, HEAD_DIM + 3, NAN)
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        assert all_nan(out[0, :, 3])
        out[0, :, 3] = 0
        assert torch.equal(out, torch.zeros_like(out))


def test_a_finite_sink_with_no_attended_value_is_not_a_nan(device, configs):
    # A sink of -inf and no positions (seq_len 0) still writes zeros.
    inp = inputs(device, [0, 5], num_kv_heads=1)
    inp.sinks.fill_(-INF)
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        assert torch.equal(out[0], torch.zeros_like(out[0])) and all_finite(out[1])


# ---- -inf logits: no weight --------------------------------------------------


def positive_dim0(inp):
    """q[..., 0] > 0 for every head, so that a key with -inf (or a huge value)
    in dim 0 gives every head a logit of -inf (or a huge one)."""
    inp.q[..., 0] = inp.q[..., 0].abs() + 0.5


@pytest.mark.parametrize("how", ["inf_key", "overflow"])
def test_minus_inf_logits_get_no_weight(device, configs, how):
    # Request 0's first 1600 positions (100 pages: whole warps and splits of
    # them) and a few scattered ones have a logit of -inf, from a -inf key
    # element or from q . K overflowing float32 below -FLT_MAX (2^100 x -2^100
    # = -2^200; its other keys have 0 in dim 0); request 1 is untouched.
    inp = inputs(device, [3000, 700])
    positive_dim0(inp)
    masked = list(range(1600)) + [1700, 2222, 2999]
    if how == "overflow":
        inp.q[..., 0] = 2.0**100
        for b, n in enumerate([3000, 700]):
            for kvh in range(2):
                set_rows(inp, b, range(n), kvh, 0, 0.0)
        value = -(2.0**100)
    else:
        value = -INF
    for kvh in range(2):
        set_rows(inp, 0, masked, kvh, 0, value)
    for cfg in configs:
        out = run_and_check(inp, what=f"{how} config {cfg}")
        assert all_finite(out)


@pytest.mark.parametrize("how", ["inf_key", "scaled_overflow"])
def test_all_logits_minus_inf_give_zero(device, configs, how):
    # Every attended logit of request 0 is -inf: the (finite or +inf) sink
    # takes all the weight and the output is 0; with a -inf sink it is 0 / 0,
    # NaN. "scaled_overflow": q . K = -2^126 is finite, but times the scale 8
    # (c = 8 log2(e)) it overflows float32.
    inp = inputs(device, [3000, 700], num_kv_heads=1)
    positive_dim0(inp)
    scale = None
    if how == "scaled_overflow":
        scale = 8.0
        inp.q[0, :, 0] = 2.0**63
        set_rows(inp, 0, range(3000), 0, slice(0, HEAD_DIM), 0.0)
        set_rows(inp, 0, range(3000), 0, 0, -(2.0**63))
    else:
        set_rows(inp, 0, range(3000), 0, 0, -INF)
    inp.sinks[0] = -INF
    inp.sinks[1] = INF
    for cfg in configs:
        out = run_and_check(inp, scale=scale, what=f"{how} config {cfg}")
        assert all_nan(out[0, 0]), "a -inf sink: 0 / 0"
        assert torch.equal(out[0, 1:], torch.zeros_like(out[0, 1:]))
        assert all_finite(out[1, 1:])


# ---- +inf logits: NaN --------------------------------------------------------


@pytest.mark.parametrize("how", ["inf_key", "overflow", "scaled_overflow"])
def test_plus_inf_logit_makes_the_heads_nan(device, configs, how):
    # Request 0 has one position whose logit is +inf (for all 8 heads of kv
    # head 0): a +inf key element, q . K = 2^200 overflowing float32, or
    # q . K = 2^126, finite, times the scale 8 (c = 8 log2(e)) overflowing.
    # The softmax is then inf / inf. Request 1 and kv head 1 are untouched.
    inp = inputs(device, [3000, 700])
    positive_dim0(inp)
    scale = None
    if how == "inf_key":
        set_rows(inp, 0, [2100], 0, 0, INF)
    else:
        big = 2.0**100 if how == "overflow" else 2.0**63
        scale = None if how == "overflow" else 8.0
        inp.q[0, heads(0), 0] = big
        set_rows(inp, 0, range(3000), 0, 0, 0.0)
        set_rows(inp, 0, [2100], 0, 0, big)
    for cfg in configs:
        out = run_and_check(inp, scale=scale, what=f"{how} config {cfg}")
        assert all_nan(out[0, heads(0)])
        assert all_finite(out[0, heads(1)]) and all_finite(out[1])


def test_large_finite_logits_stay_accurate(device, configs):
    # q . K = 2^33 for one position: scaled by 128**-0.5 log2(e) a logit of
    # 1.1e9, far past exp's range (the max shift keeps it in) but under 2^31,
    # where the op is exact (README). It takes all the weight: out = its V.
    inp = inputs(device, [3000, 700], num_kv_heads=1)
    positive_dim0(inp)
    inp.q[0, :, 0] = 2.0**20
    set_rows(inp, 0, range(3000), 0, 0, 0.0)
    set_rows(inp, 0, [2100], 0, 0, 2.0**13)
    table = inp.block_tables[0].cpu()
    v = inp.kv_cache[int(table[2100 // PAGE_TOKENS]), 0, 2100 % PAGE_TOKENS, HEAD_DIM:].float().cpu()
    for cfg in configs:
        out = run_and_check(inp, what=f"config {cfg}")
        torch.testing.assert_close(out[0], v.expand(GQA, HEAD_DIM), rtol=2**-8, atol=0)
