"""fp8 (e4m3) KV cache: the same op with ``kv_cache`` of torch.float8_e4m3fn and
fp32 ``k_scale`` / ``v_scale`` (dequantized = stored x scale, vLLM's
convention), per tensor ([1]) or per kv head ([num_kv_heads]).

The float64 reference runs on the dequantized cache, so the e4m3 rounding is
the input's and the bound is the bf16 one (testing/compare.py says why). Every
unattended fp8 slot holds an e4m3 NaN (0x7F / 0xFF): a stale-page read fails.
On the GPU every output is also checked against the CPU path (conftest).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import check_against_reference, check_output, needs_hopper, run_op

from flint_attention import flint_decode_attention
from flint_attention.testing import FP8, DEFAULT_SCALE, make_paged_inputs

RAGGED = [0, 1, 15, 16, 17, 33, 300, 4097, 0, 129]


def fp8_inputs(batch, lens, num_kv_heads, window, device, *, per_head=True, scale=None, **kw):
    """fp8 inputs with per-head scales spread around `scale` (default: the
    calibrated 4 / 448), or one scale per tensor."""
    base = 4.0 / 448 if scale is None else scale
    scales = [base * (1 + 0.5 * h) for h in range(num_kv_heads)] if per_head else base
    return make_paged_inputs(batch, lens, num_kv_heads, window, device, kv_dtype=FP8,
                             k_scale=scales, v_scale=scales if per_head else base * 0.75, **kw)


@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "per_tensor"])
@pytest.mark.parametrize("window", [None, 1, 128])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 8])
def test_fp8_against_reference(device, per_head, window, num_kv_heads):
    inp = fp8_inputs(len(RAGGED), RAGGED, num_kv_heads, window, device, per_head=per_head,
                     strided_cache=num_kv_heads == 2, shared_pages=num_kv_heads == 8)
    check_against_reference(inp, window)


@pytest.mark.parametrize("scale", [1e-3, 300.0])
@pytest.mark.parametrize("window", [None, 64])
def test_fp8_scales_far_from_one(device, scale, window):
    # stored = x / scale: at 1e-3 most values saturate at +-448 (dequantized
    # +-0.448), at 300 most are e4m3 subnormals; both are valid inputs whose
    # dequantized values the reference sees.
    inp = fp8_inputs(5, [1, 40, 0, 1000, 4097], 2, window, device, scale=scale)
    check_against_reference(inp, window)


def test_fp8_k_and_v_scales_apply_separately(device):
    # Doubling v_scale doubles the output; doubling k_scale is the same call
    # as doubling the softmax scale (both multiply the logits in fp32 before
    # the same exp2): so each scale reaches its own side.
    inp = fp8_inputs(3, [5, 300, 64], 2, None, device, per_head=False)
    base = run_op(inp, None).clone()
    k_scale, v_scale = inp.k_scale.clone(), inp.v_scale.clone()
    inp.v_scale.mul_(2)
    inp.out.fill_(math.nan)
    doubled = run_op(inp, None).clone()
    torch.testing.assert_close(doubled.float(), 2 * base.float(), rtol=2**-7, atol=0)
    inp.v_scale.copy_(v_scale)
    inp.k_scale.mul_(2)
    check_against_reference(inp, None)
    inp.k_scale.copy_(k_scale)
    check_against_reference(inp, None, 2 * DEFAULT_SCALE)


@pytest.mark.parametrize("q_scale", [1e-6, 1e5, 3e8])
def test_fp8_q_far_from_one(device, q_scale):
    # The fp8 path runs its MMAs on fp16: q is scaled by a power of two that
    # brings its largest |q| under 2^15 (1e5 and 3e8 need one), and the
    # logits scaled back; tiny q (1e-6) stays as it is (fp16 subnormals).
    inp = fp8_inputs(3, [5, 300, 2000], 2, None, device)
    inp.q.mul_(q_scale)
    check_against_reference(inp, None, DEFAULT_SCALE / max(q_scale, 1.0))


@pytest.mark.parametrize("window", [None, 128])
def test_fp8_all_empty_writes_zeros(device, window):
    inp = fp8_inputs(4, 0, 2, window, device)
    out = run_op(inp, window)
    assert torch.equal(out, torch.zeros_like(out))


def test_fp8_long_sequence(device):
    inp = fp8_inputs(2, [65536, 9000], 1, None, device, per_head=False)
    check_against_reference(inp, None)


def test_fp8_poison_is_nan():
    # The poison the other tests rely on: every unattended slot is an e4m3 NaN.
    inp = fp8_inputs(2, [5, 17], 1, None, "cpu")
    bits = inp.kv_cache.view(torch.uint8)
    unattended = bits[inp.block_tables[0, 0].item(), 0, 5:]
    assert set(unattended.unique().tolist()) <= {0x7F, 0xFF}
    assert inp.kv_cache.float().isnan().sum() > 0


# ---- validation: every error names the argument ----------------------------

NAMES = ["q", "kv_cache", "block_tables", "seq_lens", "sinks", "window", "scale", "out",
         "k_scale", "v_scale"]


def valid_fp8_args(device) -> dict:
    inp = fp8_inputs(2, [5, 20], 2, None, device, poison=False)
    return dict(q=inp.q, kv_cache=inp.kv_cache, block_tables=inp.block_tables,
                seq_lens=inp.seq_lens, sinks=inp.sinks, window=None, scale=DEFAULT_SCALE,
                out=inp.out, k_scale=inp.k_scale, v_scale=inp.v_scale)


def call(args: dict):
    return torch.ops.flint.decode_attention(*(args[n] for n in NAMES))


BAD_FP8 = [
    ("k_scale_missing", lambda a: dict(k_scale=None), r"k_scale is required with an fp8 \(Float8_e4m3fn\) kv_cache"),
    ("v_scale_missing", lambda a: dict(v_scale=None), r"v_scale is required with an fp8"),
    ("k_scale_dtype", lambda a: dict(k_scale=a["k_scale"].double()), r"k_scale must be Float, got Double"),
    ("v_scale_dtype", lambda a: dict(v_scale=a["v_scale"].bfloat16()), r"v_scale must be Float, got BFloat16"),
    ("k_scale_shape", lambda a: dict(k_scale=torch.ones(3, device=a["q"].device)), r"k_scale must have shape \[1\] \(per tensor\) or \[num_kv_heads\] = \[2\]"),
    ("v_scale_rank", lambda a: dict(v_scale=torch.ones(1, 1, device=a["q"].device)), r"v_scale must have shape \[1\]"),
    ("k_scale_strided", lambda a: dict(k_scale=torch.ones(4, device=a["q"].device)[::2]), r"k_scale must be contiguous"),
    ("e5m2", lambda a: dict(kv_cache=a["kv_cache"].view(torch.uint8).view(torch.float8_e5m2)), r"kv_cache must be BFloat16 or Float8_e4m3fn.*got Float8_e5m2 \(only the e4m3fn flavour"),
    ("e4m3fnuz", lambda a: dict(kv_cache=a["kv_cache"].view(torch.uint8).view(torch.float8_e4m3fnuz)), r"got Float8_e4m3fnuz \(only the e4m3fn flavour"),
    ("uint8", lambda a: dict(kv_cache=a["kv_cache"].view(torch.uint8)), r"kv_cache must be BFloat16 or Float8_e4m3fn .*got Byte"),
    ("scales_for_bf16", lambda a: dict(kv_cache=torch.zeros(a["kv_cache"].shape, dtype=torch.bfloat16, device=a["q"].device)), r"k_scale applies only to an fp8 kv_cache, but kv_cache is BFloat16: pass k_scale=None"),
    ("v_scale_for_bf16", lambda a: dict(kv_cache=torch.zeros(a["kv_cache"].shape, dtype=torch.bfloat16, device=a["q"].device), k_scale=None), r"v_scale applies only to an fp8 kv_cache"),
]


@pytest.mark.parametrize("change, match", [pytest.param(c, m, id=i) for i, c, m in BAD_FP8])
def test_fp8_rejects_bad_input(device, change, match):
    args = valid_fp8_args(device)
    args.update(change(args))
    with pytest.raises(RuntimeError, match=match):
        call(args)


def test_fp8_block_stride_alignment_is_in_bytes(device):
    # 16-byte alignment for fp8 is 16 elements: a block stride of 8 elements
    # past a page multiple is misaligned (for bf16 it would be fine).
    args = valid_fp8_args(device)
    cache = args["kv_cache"]
    buf = torch.zeros(cache.shape[0], cache.shape[1] * 16 * 256 + 8, dtype=torch.uint8, device=cache.device)
    strided = buf[:, : cache.shape[1] * 16 * 256].unflatten(1, cache.shape[1:]).view(FP8)
    strided.copy_(cache)
    args["kv_cache"] = strided
    with pytest.raises(RuntimeError, match=r"kv_cache pages must be 16-byte aligned \(stride\(0\) and stride\(1\) multiples of 16"):
        call(args)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_fp8_cpu_rejects_bad_scale_values(bad):
    # The data contract: the GPU takes the scales on trust (reading them needs a
    # sync), the CPU path checks them.
    args = valid_fp8_args("cpu")
    args["v_scale"][1] = bad
    with pytest.raises(RuntimeError, match=r"k_scale and v_scale must be finite and > 0"):
        call(args)


def test_fp8_wrapper_takes_scales_as_keywords(device):
    inp = fp8_inputs(2, [3, 40], 1, None, device)
    out = flint_decode_attention(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                                 None, DEFAULT_SCALE, inp.out, k_scale=inp.k_scale,
                                 v_scale=inp.v_scale)
    assert out is inp.out
    check_output(out, inp, None)


def test_fp8_opcheck(device):
    # opcheck's schema test perturbs every input with arithmetic that fp8
    # tensors lack; the bf16 opcheck (test_registration) covers the schema.
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for lens, kvh, window in [([17], 1, None), ([0, 33, 100], 2, 64)]:
        inp = fp8_inputs(len(lens), lens, kvh, window, device)
        torch.library.opcheck(torch.ops.flint.decode_attention.default,
                              (inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                               window, 0.125, inp.out, inp.k_scale, inp.v_scale),
                              test_utils=utils)


# ---- GPU only ---------------------------------------------------------------


@needs_hopper
@pytest.mark.sanitizer_subset
@pytest.mark.parametrize("window", [None, 128])
def test_fp8_cuda_graph_follows_changed_scales_and_lengths(window):
    batch, kvh = 4, 2
    sets = [[1, 4097, 0, 300], [2000, 17, 16, 5000], [0, 0, 0, 0], [33, 0, 6000, 1]]
    inputs = [fp8_inputs(batch, lens, kvh, window, "cuda", scale=s, num_blocks=1200, max_blocks=400)
              for lens, s in zip(sets, [4 / 448, 1e-3, 0.1, 300.0])]
    live = inputs[0]
    check_against_reference(live, window, what="eager warm-up")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_op(live, window)
    for step, new in enumerate(inputs[1:] + inputs[:1]):
        for name in ("q", "kv_cache", "block_tables", "seq_lens", "sinks", "k_scale", "v_scale"):
            getattr(live, name).copy_(getattr(new, name))
        live.out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_output(live.out, new, window, what=f"replay {step}")


@needs_hopper
def test_fp8_repeated_runs_are_bitwise_identical():
    inp = fp8_inputs(3, [65536, 5, 3000], 2, None, "cuda")
    first = check_against_reference(inp, None).clone()
    for run in range(10):
        inp.out.fill_(math.nan)
        assert torch.equal(run_op(inp, None), first), f"run {run + 1} differs from run 0"
