"""Every input the op rejects (csrc/ops/validation.cpp, and the data contract the
CPU path checks): each raises RuntimeError with a message naming the argument,
and the same message under FakeTensorMode (the op's Meta kernel runs the same
checks). The wrapper adds what the dispatcher cannot tell: a bool window, a
window past int64, None or a non-tensor for a tensor (TypeError)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from conftest import needs_hopper
from torch._subclasses.fake_tensor import FakeTensorMode

from flint_attention import flint_decode_attention
from flint_attention.testing import DEFAULT_SCALE, FP8, make_paged_inputs

NAMES = ["q", "kv_cache", "block_tables", "seq_lens", "sinks", "window", "scale", "out"]


def valid_args(device) -> dict:
    inp = make_paged_inputs(2, [5, 20], 1, None, device, poison=False)
    return dict(
        q=inp.q,
        kv_cache=inp.kv_cache,
        block_tables=inp.block_tables,
        seq_lens=inp.seq_lens,
        sinks=inp.sinks,
        window=None,
        scale=DEFAULT_SCALE,
        out=inp.out,
    )


def call(args: dict):
    extra = {"lse": args["lse"]} if "lse" in args else {}
    return torch.ops.flint.decode_attention(*(args[n] for n in NAMES), **extra)


# Layout helpers: a tensor with t's values but a different memory layout.
def misaligned(t):
    """Data pointer one element (2 or 4 bytes) past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return flat.view(t.shape).copy_(t)


def padded(t, dim, extra):
    """Size of dim kept, stride of the dims before it widened by ``extra``."""
    shape = list(t.shape)
    shape[dim] += extra
    buf = torch.zeros(shape, dtype=t.dtype, device=t.device)
    return buf.narrow(dim, 0, t.shape[dim]).copy_(t)


def every_other(t, dim):
    """Stride 2 along dim."""
    shape = list(t.shape)
    shape[dim] *= 2
    buf = torch.zeros(shape, dtype=t.dtype, device=t.device)
    return buf[(slice(None),) * dim + (slice(None, None, 2),)].copy_(t)


def block_padded(kv_cache):
    """Blocks 4097 elements apart: a block stride that is not a multiple of 8."""
    return padded(kv_cache.flatten(1), 1, 1).unflatten(1, kv_cache.shape[1:])


def overlapping(q):
    """q and an out of its shape in one buffer, out starting at q's second head."""
    buf = torch.empty(2 * q.numel(), dtype=q.dtype, device=q.device)
    q2 = buf[: q.numel()].view(q.shape).copy_(q)
    return dict(q=q2, out=buf[128 : 128 + q.numel()].view(q.shape))


def with_shape(t, *shape):
    return torch.zeros(shape, dtype=t.dtype, device=t.device)


def strided_over(t, *strides):
    """A tensor of t's shape and dtype with these strides over a fresh buffer
    (elements may coincide)."""
    size = 1 + sum((n - 1) * s for n, s in zip(t.shape, strides))
    return torch.zeros(size, dtype=t.dtype, device=t.device).as_strided(t.shape, strides)


def out_over_strided_cache(a, offset):
    """kv_cache the even kv heads of a buffer (a strided view), out a dense
    view of that buffer from element ``offset``."""
    kv, out = a["kv_cache"], a["out"]
    buf = torch.zeros(kv.shape[0], 2 * kv.shape[1], *kv.shape[2:], dtype=kv.dtype, device=kv.device)
    cache = buf[:, ::2].copy_(kv)
    return dict(kv_cache=cache, out=buf.view(-1)[offset : offset + out.numel()].view(out.shape))


def out_over_strided_q(a):
    """q every other 128 elements of a buffer (not dense), out a dense view
    from q's second row on: their elements partly coincide."""
    q = a["q"]
    buf = torch.zeros(2 * q.numel(), dtype=q.dtype, device=q.device)
    q2 = buf.view(*q.shape[:2], 256)[..., :128].copy_(q)
    return dict(q=q2, out=buf[256 : 256 + q.numel()].view(q.shape))


# (id, change to the valid args, regex the message must match)
BAD_INPUTS = [
    # dtypes
    ("q_dtype", lambda a: dict(q=a["q"].half()), r"q must be BFloat16, got Half"),
    ("kv_cache_dtype", lambda a: dict(kv_cache=a["kv_cache"].half()), r"kv_cache must be BFloat16"),
    ("block_tables_dtype", lambda a: dict(block_tables=a["block_tables"].long()), r"block_tables must be Int, got Long"),
    ("seq_lens_dtype", lambda a: dict(seq_lens=a["seq_lens"].long()), r"seq_lens must be Int"),
    ("sinks_dtype", lambda a: dict(sinks=a["sinks"].bfloat16()), r"sinks must be Float, got BFloat16"),
    ("out_dtype", lambda a: dict(out=a["out"].float()), r"out must be BFloat16, got Float"),
    # ranks
    ("q_rank", lambda a: dict(q=a["q"][0]), r"q must be \[batch, num_heads, head_dim\] \(one query token per request\) or \[batch, q_tokens, num_heads, head_dim\], got a 2-D"),
    ("q_rank_5", lambda a: dict(q=a["q"][None, None]), r"q must be \[batch, num_heads, head_dim\] .* got a 5-D"),
    ("kv_cache_rank", lambda a: dict(kv_cache=a["kv_cache"][0]), r"kv_cache must be \[num_blocks, .*\(4-D\), got a 3-D"),
    ("block_tables_rank", lambda a: dict(block_tables=a["block_tables"][0]), r"block_tables must be .*\(2-D\), got a 1-D"),
    ("seq_lens_rank", lambda a: dict(seq_lens=a["seq_lens"][None]), r"seq_lens must be \[batch\] \(1-D\), got a 2-D"),
    ("sinks_rank", lambda a: dict(sinks=a["sinks"][None]), r"sinks must be \[num_heads\] \(1-D\), got a 2-D"),
    ("out_rank", lambda a: dict(out=a["out"][0]), r"out must have the shape of q \[2, 8, 128\], got \[8, 128\]"),
    # shapes
    ("head_dim", lambda a: dict(q=with_shape(a["q"], 2, 8, 96), out=with_shape(a["out"], 2, 8, 96)), r"q must have head_dim 64, 128 or 256 \(its last dim\), got shape \[2, 8, 96\]"),
    ("head_dim_vs_cache", lambda a: dict(q=with_shape(a["q"], 2, 8, 64), out=with_shape(a["out"], 2, 8, 64)), r"kv_cache must be \[num_blocks, num_kv_heads, 16, 2 \* head_dim\] = \[num_blocks, num_kv_heads, 16, 128\]"),
    ("group_17", lambda a: dict(q=with_shape(a["q"], 2, 17, 128), out=with_shape(a["out"], 2, 17, 128)), r"q's num_heads must be group x num_kv_heads with a group \(query heads per kv head\) of 1 to 16, got num_heads 17 with num_kv_heads 1"),
    ("heads_do_not_divide", lambda a: dict(q=with_shape(a["q"], 2, 9, 128), out=with_shape(a["out"], 2, 9, 128), kv_cache=with_shape(a["kv_cache"], 4, 2, 16, 256)), r"num_heads must be group x num_kv_heads .*got num_heads 9 with num_kv_heads 2"),
    ("fewer_heads_than_kv", lambda a: dict(q=with_shape(a["q"], 2, 1, 128), out=with_shape(a["out"], 2, 1, 128), kv_cache=with_shape(a["kv_cache"], 4, 2, 16, 256)), r"num_heads must be group x num_kv_heads .*got num_heads 1 with num_kv_heads 2"),
    ("q_tokens_9", lambda a: dict(q=with_shape(a["q"], 2, 9, 8, 128), out=with_shape(a["out"], 2, 9, 8, 128)), r"q must have 1 to 8 query tokens per request .*got shape \[2, 9, 8, 128\]"),
    ("q_tokens_0", lambda a: dict(q=with_shape(a["q"], 2, 0, 8, 128), out=with_shape(a["out"], 2, 0, 8, 128)), r"q must have 1 to 8 query tokens per request"),
    ("no_kv_heads", lambda a: dict(kv_cache=with_shape(a["kv_cache"], 4, 0, 16, 256)), r"kv_cache must have at least one kv head"),
    ("page_size", lambda a: dict(kv_cache=with_shape(a["kv_cache"], 4, 1, 8, 256)), r"kv_cache must be \[num_blocks, num_kv_heads, 16, 2 \* head_dim\] = \[num_blocks, num_kv_heads, 16, 256\]"),
    ("cache_last_dim", lambda a: dict(kv_cache=with_shape(a["kv_cache"], 4, 1, 16, 128)), r"kv_cache must be \[num_blocks, num_kv_heads, 16, 2 \* head_dim\] = \[num_blocks, num_kv_heads, 16, 256\]"),
    ("out_batch", lambda a: dict(out=with_shape(a["out"], 3, 8, 128)), r"out must have the shape of q"),
    ("out_heads", lambda a: dict(out=with_shape(a["out"], 2, 16, 128)), r"out must have the shape of q"),
    ("block_tables_batch", lambda a: dict(block_tables=a["block_tables"][:1]), r"block_tables must have 2 rows"),
    ("seq_lens_batch", lambda a: dict(seq_lens=a["seq_lens"][:1]), r"seq_lens must have 2 entries"),
    ("sinks_shape", lambda a: dict(sinks=a["sinks"][:4]), r"sinks must have num_heads = 8 entries \(one logit per query head\), got shape \[4\]"),
    ("lse_dtype", lambda a: dict(lse=torch.zeros(2, 8, dtype=torch.bfloat16, device=a["q"].device)), r"lse must be Float, got BFloat16"),
    ("lse_shape", lambda a: dict(lse=torch.zeros(2, 8, 128, device=a["q"].device)), r"lse must have the shape of q without its last dim, \[2, 8\], got \[2, 8, 128\]"),
    ("lse_in_out", lambda a: dict(lse=a["out"].view(-1)[:32].view(torch.float32).view(2, 8)), r"out must not share memory with lse"),
    ("lse_in_q", lambda a: dict(lse=a["q"].view(-1)[:32].view(torch.float32).view(2, 8)), r"lse must not share memory with q"),
    ("lse_expanded", lambda a: dict(lse=torch.zeros(1, 8, device=a["q"].device).expand(2, 8)), r"lse must not have overlapping elements"),
    # strides and alignment
    ("cache_row_stride", lambda a: dict(kv_cache=padded(a["kv_cache"], 3, 8)), r"kv_cache pages must be contiguous"),
    ("cache_last_stride", lambda a: dict(kv_cache=a["kv_cache"].transpose(2, 3).contiguous().transpose(2, 3)), r"kv_cache pages must be contiguous"),
    ("cache_misaligned", lambda a: dict(kv_cache=misaligned(a["kv_cache"])), r"kv_cache pages must be 16-byte aligned"),
    ("cache_block_stride", lambda a: dict(kv_cache=block_padded(a["kv_cache"])), r"kv_cache pages must be 16-byte aligned \(stride\(0\) and stride\(1\) multiples of 8"),
    ("q_last_dim_strided", lambda a: dict(q=every_other(a["q"], 2)), r"q must have a contiguous last dim"),
    ("out_last_dim_strided", lambda a: dict(out=every_other(a["out"], 2)), r"out must have a contiguous last dim"),
    ("q_row_stride", lambda a: dict(q=padded(a["q"], 2, 1)), r"q rows must be 16-byte aligned"),
    ("q_misaligned", lambda a: dict(q=misaligned(a["q"])), r"q rows must be 16-byte aligned"),
    ("out_row_stride", lambda a: dict(out=padded(a["out"], 2, 1)), r"out rows must be 16-byte aligned"),
    ("out_misaligned", lambda a: dict(out=misaligned(a["out"])), r"out rows must be 16-byte aligned"),
    ("block_tables_rows", lambda a: dict(block_tables=every_other(a["block_tables"], 1)), r"block_tables rows must be contiguous"),
    ("seq_lens_strided", lambda a: dict(seq_lens=every_other(a["seq_lens"], 0)), r"seq_lens must be contiguous"),
    ("sinks_strided", lambda a: dict(sinks=every_other(a["sinks"], 0)), r"sinks must be contiguous"),
    # scalars
    ("window_0", lambda a: dict(window=0), r"window must be None or >= 1, got 0"),
    ("window_neg", lambda a: dict(window=-1), r"window must be None or >= 1, got -1"),
    ("scale_0", lambda a: dict(scale=0.0), r"scale must be finite and > 0 .*got 0"),
    ("scale_neg", lambda a: dict(scale=-1.0), r"scale must be finite and > 0 .*got -1"),
    ("scale_nan", lambda a: dict(scale=math.nan), r"scale must be finite and > 0 .*got nan"),
    ("scale_inf", lambda a: dict(scale=math.inf), r"scale must be finite and > 0 .*got inf"),
    ("scale_neg_inf", lambda a: dict(scale=-math.inf), r"scale must be finite and > 0 .*got -inf"),
    ("scale_float_overflow", lambda a: dict(scale=1e39), r"scale \* log2\(e\) finite in float32\), got 1e\+39"),
    # aliasing: every output element is written once while inputs are read
    ("out_expanded", lambda a: dict(out=a["out"][:1].expand(2, 8, 128)), r"out must not have overlapping elements .*got shape \[2, 8, 128\] and strides \[0, 128, 1\]"),
    ("out_rows_overlap", lambda a: dict(out=strided_over(a["out"], 1024, 64, 1)), r"out must not have overlapping elements .*got shape \[2, 8, 128\] and strides \[1024, 64, 1\]"),
    ("out_batches_overlap", lambda a: dict(out=strided_over(a["out"], 8, 128, 1)), r"out must not have overlapping elements .*strides \[8, 128, 1\]"),
    ("out_over_strided_kv_cache", lambda a: out_over_strided_cache(a, 0), r"out must not share memory with kv_cache \(their byte ranges in one storage must not meet\), got out over bytes \[0, 4096\) and kv_cache over \[0, "),
    # between the view's elements: refused too (a range test cannot tell)
    ("out_in_strided_kv_cache_gap", lambda a: out_over_strided_cache(a, 16 * 256), r"out must not share memory with kv_cache"),
    ("out_partly_over_strided_q", out_over_strided_q, r"out must not share memory with q \(their byte ranges .*got out over bytes \[512, 4608\) and q over \[0, 7936\)"),
    ("out_is_q", lambda a: dict(out=a["q"]), r"out must not share memory with q"),
    ("out_in_kv_cache", lambda a: dict(out=a["kv_cache"].view(-1)[: 2 * 8 * 128].view(2, 8, 128)), r"out must not share memory with kv_cache"),
    ("out_overlaps_q", lambda a: overlapping(a["q"]), r"out must not share memory with q"),
    # None through the dispatcher (an undefined tensor in C++)
    ("q_none", lambda a: dict(q=None), r"q must be a tensor, got None"),
    ("kv_cache_none", lambda a: dict(kv_cache=None), r"kv_cache must be a tensor, got None"),
    ("out_none", lambda a: dict(out=None), r"out must be a tensor, got None"),
]


@pytest.mark.parametrize("change, match", [pytest.param(c, m, id=i) for i, c, m in BAD_INPUTS])
def test_rejects_bad_input(device, change, match):
    args = valid_args(device)
    args.update(change(args))
    with pytest.raises(RuntimeError, match=match):
        call(args)


@pytest.mark.parametrize("change, match", [pytest.param(c, m, id=i) for i, c, m in BAD_INPUTS])
def test_fake_tensors_raise_the_same_errors(change, match):
    # Under FakeTensorMode (what torch.compile traces with) the op's Meta
    # kernel runs the checks above, so a traced call fails as the real one.
    args = valid_args("cpu")
    args.update(change(args))
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        with pytest.raises(RuntimeError, match=match):
            call(fake)


def test_torch_compile_raises_while_tracing():
    # The error comes from tracing with fake tensors (dynamo wraps it), before
    # anything runs.
    args = valid_args("cpu")
    args["sinks"] = args["sinks"][:4]

    def step(q, kv_cache, block_tables, seq_lens, sinks, out):
        return flint_decode_attention(q, kv_cache, block_tables, seq_lens, sinks, None, 0.1, out)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=r"sinks must have num_heads = 8 entries"):
        compiled(*(args[n] for n in ["q", "kv_cache", "block_tables", "seq_lens", "sinks", "out"]))
    assert args["out"].isnan().all(), "nothing ran"


# The wrapper's own checks: what the dispatcher would pass on as something else.
def wrapper_call(args: dict, **changes):
    a = dict(args, **changes)
    extra = {"lse": a["lse"]} if "lse" in a else {}
    return flint_decode_attention(*(a[n] for n in NAMES), **extra)


# Window and scale of the wrong type: what the dispatcher would pass on as
# something else (True as window 1, torch.tensor(8.7) as window 8, a tensor
# scale read on the host) or cannot carry. (id, window, scale, error, regex)
BAD_SCALARS = [
    ("window_true", True, DEFAULT_SCALE, TypeError, r"window must be None or an int, got True \(a bool\)"),
    ("window_false", False, DEFAULT_SCALE, TypeError, r"window must be None or an int, got False \(a bool\)"),
    ("window_float", 2.0, DEFAULT_SCALE, TypeError, r"window must be None or an int, got a float$"),
    ("window_str", "16", DEFAULT_SCALE, TypeError, r"window must be None or an int, got a str$"),
    ("window_list", [16], DEFAULT_SCALE, TypeError, r"window must be None or an int, got a list$"),
    ("window_numpy_float", np.float32(8.7), DEFAULT_SCALE, TypeError, r"window must be None or an int, got a numpy float32$"),
    ("window_numpy_bool", np.bool_(True), DEFAULT_SCALE, TypeError, r"window must be None or an int, got a numpy bool$"),
    ("window_tensor", torch.tensor(8), DEFAULT_SCALE, TypeError, r"window must be None or an int, got a Tensor \(the op reads it on the host"),
    ("window_float_tensor", torch.tensor(8.7), DEFAULT_SCALE, TypeError, r"window must be None or an int, got a Tensor"),
    ("window_past_int64", 2**63, DEFAULT_SCALE, RuntimeError, r"window must be None or >= 1 and fit int64 .*got 9223372036854775808"),
    ("window_below_int64", -(2**63) - 1, DEFAULT_SCALE, RuntimeError, r"window must be None or >= 1 and fit int64 .*got -9223372036854775809"),
    ("scale_tensor", None, torch.tensor(0.1), TypeError, r"scale must be a float, got a Tensor \(the op reads it on the host"),
    ("scale_str", None, "0.1", TypeError, r"scale must be a float, got a str$"),
    ("scale_bool", None, True, TypeError, r"scale must be a float, got True \(a bool\)"),
    ("scale_none", None, None, TypeError, r"scale must be a float, got None$"),
]
SCALAR_CASES = [pytest.param(w, s, e, m, id=i) for i, w, s, e, m in BAD_SCALARS]


def wrapper_step(window, scale):
    def step(q, kv_cache, block_tables, seq_lens, sinks, out):
        return flint_decode_attention(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out)

    return step


def op_step(window, scale, overload=False, keywords=False):
    op = torch.ops.flint.decode_attention.default if overload else torch.ops.flint.decode_attention

    def step(q, kv_cache, block_tables, seq_lens, sinks, out):
        if keywords:
            return op(q, kv_cache, block_tables, seq_lens, sinks, window=window, scale=scale, out=out)
        return op(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out)

    return step


def tensors(args: dict) -> list:
    return [args[n] for n in ["q", "kv_cache", "block_tables", "seq_lens", "sinks", "out"]]


@pytest.mark.parametrize("window, scale, error, match", SCALAR_CASES)
def test_wrapper_refuses_a_scalar_of_the_wrong_type(window, scale, error, match):
    args = valid_args("cpu")
    with pytest.raises(error, match=match):
        wrapper_step(window, scale)(*tensors(args))
    assert args["out"].isnan().all(), "nothing ran"


@pytest.mark.parametrize("form", ["packet", "overload", "keywords"])
@pytest.mark.parametrize("window, scale, error, match", SCALAR_CASES)
def test_op_refuses_a_scalar_of_the_wrong_type(window, scale, error, match, form):
    # The op's own callable checks before torch converts the value for the
    # schema (ops._with_scalar_checks): a direct call refuses as the wrapper.
    args = valid_args("cpu")
    step = op_step(window, scale, overload=form == "overload", keywords=form == "keywords")
    with pytest.raises(error, match=match):
        step(*tensors(args))
    assert args["out"].isnan().all(), "nothing ran"


@pytest.mark.parametrize("window, scale, error, match", SCALAR_CASES)
def test_torch_compile_refuses_a_scalar_as_eager(window, scale, error, match):
    # Without fullgraph the traced call raises, the frame runs eagerly and
    # raises the eager error itself; with fullgraph Dynamo reports that error
    # (an Unsupported "Observed exception" holding it), never an internal error.
    args = valid_args("cpu")
    torch._dynamo.reset()
    with pytest.raises(error, match=match) as raised:
        torch.compile(wrapper_step(window, scale), backend="eager")(*tensors(args))
    assert not isinstance(raised.value, torch._dynamo.exc.TorchDynamoException), raised.value
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"Observed exception") as raised:
        torch.compile(wrapper_step(window, scale), fullgraph=True, backend="eager")(*tensors(args))
    assert re.search(match.removesuffix("$"), str(raised.value)), raised.value
    assert args["out"].isnan().all(), "nothing ran"


@pytest.mark.parametrize("window, scale, error, match", SCALAR_CASES)
def test_torch_compile_of_the_op_refuses_a_scalar(window, scale, error, match):
    # A direct call traced: the op's check runs on the traced values (a tensor
    # is a fake tensor then), and Dynamo reports its error.
    args = valid_args("cpu")
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.TorchDynamoException) as raised:
        torch.compile(op_step(window, scale), fullgraph=True, backend="eager")(*tensors(args))
    assert not isinstance(raised.value, torch._dynamo.exc.InternalTorchDynamoError), raised.value
    # What the error names is the traced value (a tensor for a numpy number).
    assert re.search(re.split(r",? got ", match)[0], str(raised.value)), raised.value


# Numbers the op takes however they come: an int window (numpy integers too)
# and a float scale (numpy floats and ints too). (window, scale)
GOOD_SCALARS = [
    (2**63 - 1, DEFAULT_SCALE),
    (np.int64(10**6), DEFAULT_SCALE),
    (np.int32(30), DEFAULT_SCALE),
    (np.uint8(30), DEFAULT_SCALE),
    (np.array(30), DEFAULT_SCALE),
    (None, np.float32(DEFAULT_SCALE)),
    (None, np.float64(DEFAULT_SCALE)),
    (None, np.array(DEFAULT_SCALE)),
    (None, 1),
]


def same_as_python_numbers(window, scale, run) -> bool:
    """run(window, scale)'s output equals the op's with window and scale as Python numbers."""
    args = valid_args("cpu")
    plain = window if window is None else int(window)
    expected = wrapper_step(plain, float(scale))(*tensors(args)).clone()
    args["out"].fill_(math.nan)
    run(window, scale)(*tensors(args))
    return torch.equal(args["out"], expected)


@pytest.mark.parametrize("window, scale", GOOD_SCALARS, ids=repr)
def test_numpy_and_python_numbers_work_eagerly(window, scale):
    assert same_as_python_numbers(window, scale, wrapper_step)
    assert same_as_python_numbers(window, scale, op_step)


@pytest.mark.parametrize("window, scale", GOOD_SCALARS, ids=repr)
def test_numpy_and_python_numbers_work_compiled(window, scale):
    # torch.compile traces numpy numbers as tensors: the wrapper then refuses
    # them in the traced code, and the call runs eagerly, where they convert.
    torch._dynamo.reset()
    assert same_as_python_numbers(window, scale, lambda w, s: torch.compile(wrapper_step(w, s)))


@pytest.mark.parametrize("name, window, scale", [("window", np.int64(30), DEFAULT_SCALE), ("scale", None, np.float32(0.1))])
def test_numpy_numbers_with_fullgraph_get_flints_error(name, window, scale):
    # A compiled graph could pass their values to the op only as
    # data-dependent ones, which it cannot take.
    torch._dynamo.reset()
    compiled = torch.compile(wrapper_step(window, scale), fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.Unsupported, match=rf"under torch.compile, {name} must be a Python \w+, got a numpy \w+ \(traced as a tensor\)"):
        compiled(*tensors(valid_args("cpu")))


@pytest.mark.parametrize("name", ["q", "kv_cache", "block_tables", "seq_lens", "out"])
@pytest.mark.parametrize("value", [None, [1.0]], ids=["None", "list"])
def test_wrapper_rejects_a_non_tensor(name, value):
    with pytest.raises(TypeError, match=rf"flint.decode_attention: {name} must be a tensor, got {'None' if value is None else 'a list'}"):
        wrapper_call(valid_args("cpu"), **{name: value})


def test_wrapper_rejects_a_non_tensor_scale():
    args = valid_args("cpu")
    with pytest.raises(TypeError, match=r"k_scale must be None or a tensor, got a float"):
        flint_decode_attention(*(args[n] for n in NAMES), k_scale=0.5)


@needs_hopper
@pytest.mark.parametrize("name", ["kv_cache", "block_tables", "seq_lens", "sinks", "out"])
def test_rejects_mixed_devices(name):
    args = valid_args("cuda")
    args[name] = args[name].cpu()
    with pytest.raises(RuntimeError, match=rf"all tensors must be on one device; q is on cuda:0 but {name} is on cpu"):
        call(args)


# The data contract: the GPU trusts it (checking needs a sync), the CPU path checks it.
def test_cpu_rejects_seq_len_beyond_block_table():
    args = valid_args("cpu")
    max_len = 16 * args["block_tables"].shape[1]
    args["seq_lens"][1] = max_len + 1
    with pytest.raises(RuntimeError, match=rf"seq_lens\[1\] must be in \[0, 16 \* block_tables.size\(1\)\] = \[0, {max_len}\], got {max_len + 1}"):
        call(args)


def test_cpu_rejects_negative_seq_len():
    args = valid_args("cpu")
    args["seq_lens"][0] = -3
    with pytest.raises(RuntimeError, match=r"seq_lens\[0\] must be in \[0, .*\], got -3"):
        call(args)


@pytest.mark.parametrize("bad_id", ["num_blocks", -1])
def test_cpu_rejects_block_id_out_of_range(bad_id):
    args = valid_args("cpu")
    num_blocks = args["kv_cache"].shape[0]
    bad = num_blocks if bad_id == "num_blocks" else bad_id
    args["block_tables"][1, 1] = bad  # request 1 has 20 tokens: pages 0 and 1
    with pytest.raises(RuntimeError, match=rf"block_tables\[1, 1\] \(attended by request 1\) must be a block of kv_cache, in \[0, {num_blocks}\), got {bad}"):
        call(args)


# Edge inputs that are valid.
def test_batch_zero_is_a_no_op(device):
    q = torch.empty(0, 8, 128, dtype=torch.bfloat16, device=device)
    kv_cache = torch.empty(0, 1, 16, 256, dtype=torch.bfloat16, device=device)
    block_tables = torch.empty(0, 0, dtype=torch.int32, device=device)
    seq_lens = torch.empty(0, dtype=torch.int32, device=device)
    sinks = torch.zeros(8, device=device)
    out = torch.empty(0, 8, 128, dtype=torch.bfloat16, device=device)
    result = flint_decode_attention(q, kv_cache, block_tables, seq_lens, sinks, None, 0.1, out)
    assert result is out and out.shape == (0, 8, 128)


def test_zero_width_block_table_with_empty_requests(device):
    inp = make_paged_inputs(3, 0, 1, None, device, max_blocks=0)
    assert inp.block_tables.shape == (3, 0)
    flint_decode_attention(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, None, 0.1, inp.out)
    assert torch.equal(inp.out, torch.zeros_like(inp.out))


ALIASING = [pytest.param(c, m, id=i) for i, c, m in BAD_INPUTS
            if "overlapping elements" in m or "share memory" in m]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("change, match", ALIASING)
def test_torch_compile_refuses_aliasing(change, match, dynamic):
    args = valid_args("cpu")
    args.update(change(args))

    def step(q, kv_cache, block_tables, seq_lens, sinks, out, lse):
        return flint_decode_attention(q, kv_cache, block_tables, seq_lens, sinks, None, 0.1, out, lse=lse)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    what = match.split(" .*")[0].split(r" \(")[0]  # shapes print as symbols when dynamic
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=what):
        compiled(*(args.get(n) for n in ["q", "kv_cache", "block_tables", "seq_lens", "sinks", "out", "lse"]))


def fp8_args() -> dict:
    inp = make_paged_inputs(2, [5, 20], 1, None, "cpu", poison=False, kv_dtype=FP8, k_scale=[0.01], v_scale=0.02)
    return dict(valid_args("cpu"), kv_cache=inp.kv_cache, k_scale=inp.k_scale, v_scale=inp.v_scale)


def in_one_buffer(args: dict, name: str, gap: int) -> dict:
    """args with ``name`` and then out in one byte buffer: ``name`` ends at a
    16-byte boundary, out starts ``gap`` bytes past it (negative: they overlap)."""
    t, out = args[name], args["out"]
    t_bytes, out_bytes = t.numel() * t.element_size(), out.numel() * out.element_size()
    end = 4096 + -(-t_bytes // 16) * 16
    buf = torch.zeros(end + out_bytes, dtype=torch.uint8)
    moved = buf[end - t_bytes : end].view(t.dtype).view(t.shape).copy_(t)
    return dict(args, **{name: moved, "out": buf[end + gap : end + gap + out_bytes].view(out.dtype).view(out.shape)})


INPUT_NAMES = ["q", "kv_cache", "block_tables", "seq_lens", "sinks", "k_scale", "v_scale"]


@pytest.mark.parametrize("fake", [False, True], ids=["eager", "fake"])
@pytest.mark.parametrize("name", INPUT_NAMES)
def test_out_may_follow_an_input_in_one_storage_but_not_overlap_it(name, fake):
    # The byte ranges in one storage: out right after the input is fine; out
    # starting 16 bytes before the input's end is refused, whatever the dtypes.
    args = fp8_args()
    touching, overlapping = in_one_buffer(args, name, 0), in_one_buffer(args, name, -16)

    def run(a):
        if not fake:
            return flint_decode_attention(*(a[n] for n in NAMES), k_scale=a["k_scale"], v_scale=a["v_scale"])
        with FakeTensorMode() as mode:
            f = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in a.items()}
            return flint_decode_attention(*(f[n] for n in NAMES), k_scale=f["k_scale"], v_scale=f["v_scale"])

    run(touching)
    with pytest.raises(RuntimeError, match=rf"out must not share memory with {name} \(their byte ranges"):
        run(overlapping)
