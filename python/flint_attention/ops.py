"""The Python face of ``torch.ops.flint.decode_attention``: the typed wrapper,
with the argument checks the dispatcher cannot make, and the op's docstring.

Every other check is C++ (csrc/ops/validation.cpp), run by each backend and by
the op's Meta kernel, which FakeTensor and ``torch.compile`` use: traced calls
raise the real op's errors. Fake tensors look like meta tensors to C++, so the
one check the wrapper adds for them is that all tensors are on one device (a
direct ``torch.ops`` call under FakeTensorMode skips it; the real call makes it).
"""

from __future__ import annotations

import inspect

import torch

from flint_attention import _C

PAGE_TOKENS = 16  # tokens per cache block
HEAD_DIMS = (64, 128, 256)  # the head dims the op takes
MAX_GROUP = 16  # query heads per kv head: 1 to 16
MAX_QUERY_TOKENS = 8  # query tokens per request: 1 to 8
# The head_dim the CUDA kernels are compiled for today (the CPU path takes
# every head dim above), and the testing helpers' default shape.
HEAD_DIM = 128
GQA = 8

# Whether this build has the CUDA kernel (setup.py builds without it where
# there is no nvcc, or with FLINT_CPU_ONLY=1; CUDA tensors then raise).
HAS_CUDA_KERNEL = bool(_C.HAS_CUDA_KERNEL)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_Tensor = torch.Tensor
try:
    import numpy

    _NUMPY_TYPES: tuple[type, ...] = (numpy.generic, numpy.ndarray)
except ImportError:  # then no numpy value can reach the op
    _NUMPY_TYPES = ()

# Why window and scale must not be tensors: the dispatcher would take one for
# `int? window` or `float scale` and read its value on the host (int(t) or
# float(t): a 8.7 window runs as 8, a CUDA tensor costs a sync, and a captured
# graph keeps the value read at capture).
_NOT_A_TENSOR = "the op reads it on the host: pass a Python number, e.g. int(t) or float(t)"


def _numpy_dtype(x) -> torch.dtype | None:
    """The dtype of a numpy scalar or 0-d array as torch's, else None. Read
    through torch.as_tensor: torch.compile traces numpy values as tensors (a
    numpy scalar is a 0-d array there, whose .dtype it cannot read)."""
    if not isinstance(x, _NUMPY_TYPES) or x.ndim != 0:
        return None
    return torch.as_tensor(x).dtype


def _from_numpy(x, dtype: torch.dtype, to: type, name: str):
    """A numpy number as a Python one. Not under torch.compile: it traces
    numpy numbers as tensors, whose value a compiled graph can only pass to
    the op as a data-dependent one, which the op cannot take. The TypeError
    there makes torch.compile run the call eagerly (fullgraph=False), where
    the number converts; with fullgraph=True it is the error Dynamo reports."""
    if torch.compiler.is_compiling():
        raise TypeError(
            f"flint.decode_attention: under torch.compile, {name} must be a Python {to.__name__}, got "
            f"a numpy {_dtype_name(dtype)} (traced as a tensor): convert it before the compiled region"
        )
    return to(x)


def _what(x) -> str:
    """What x is, for an error message: numpy numbers by their dtype (under
    torch.compile their type is an array's)."""
    if x is None:
        return "None"
    dtype = _numpy_dtype(x)
    return f"a numpy {_dtype_name(dtype)}" if dtype is not None else f"a {type(x).__name__}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _window_arg(window):
    """The window as the op takes it: None, an int that fits int64 (numpy
    integers become ints) or a SymInt (torch.compile). Refuses what the
    dispatcher would pass on as something else: a bool (as 1 or 0), a float
    or a tensor (truncated), and what it cannot carry (past int64)."""
    if window is None or isinstance(window, torch.SymInt):
        return window
    if isinstance(window, torch.Tensor):
        raise TypeError(f"flint.decode_attention: window must be None or an int, got a Tensor ({_NOT_A_TENSOR})")
    if isinstance(window, bool):
        raise TypeError(f"flint.decode_attention: window must be None or an int, got {window} (a bool)")
    dtype = _numpy_dtype(window)
    if dtype is not None and dtype != torch.bool and not dtype.is_floating_point and not dtype.is_complex:
        window = _from_numpy(window, dtype, int, "window")
    elif not isinstance(window, int):
        raise TypeError(f"flint.decode_attention: window must be None or an int, got {_what(window)}")
    if not _INT64_MIN <= window <= _INT64_MAX:
        raise RuntimeError(
            "flint.decode_attention: window must be None or >= 1 and fit int64 (<= 2**63 - 1; any "
            f"window >= seq_len attends to every position), got {window}"
        )
    return window


def _scale_arg(scale):
    """The scale as the op takes it: a float or an int (numpy numbers become
    floats), or a SymFloat / SymInt (torch.compile). Refuses a tensor (read
    on the host), a bool, and anything else that is not a real number."""
    if isinstance(scale, torch.Tensor):
        raise TypeError(f"flint.decode_attention: scale must be a float, got a Tensor ({_NOT_A_TENSOR})")
    if isinstance(scale, bool):
        raise TypeError(f"flint.decode_attention: scale must be a float, got {scale} (a bool)")
    dtype = _numpy_dtype(scale)
    if dtype is not None and dtype != torch.bool and not dtype.is_complex:
        return _from_numpy(scale, dtype, float, "scale")
    if not isinstance(scale, (float, int, torch.SymFloat, torch.SymInt)):
        raise TypeError(f"flint.decode_attention: scale must be a float, got {_what(scale)}")
    return scale


def _check_tensors(tensors: dict) -> None:
    """Raises for anything but a tensor where the op takes one (None becomes
    an undefined tensor in the dispatcher), and for tensors on several
    devices: the C++ check's words, for fake tensors, which are all on the
    meta device to C++."""
    for name, t in tensors.items():
        optional = name in ("sinks", "k_scale", "v_scale", "lse")
        if not isinstance(t, torch.Tensor) and not (optional and t is None):
            expected = "None or a tensor" if optional else "a tensor"
            raise TypeError(f"flint.decode_attention: {name} must be {expected}, got {_what(t)}")
    device = tensors["q"].device
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise RuntimeError(
                f"flint.decode_attention: all tensors must be on one device; q is on {device} but "
                f"{name} is on {t.device}"
            )


def flint_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: torch.Tensor | None,
    window: int | None,
    scale: float,
    out: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged decode attention with optional sinks, 1 to 8 query tokens per request.

    With G = num_heads / num_kv_heads query heads per kv head (1 to 16) and Q
    query tokens per request: for each request b, query token i and query head
    h (kv head h // G), token i sits at position t = L - Q + i with L =
    seq_lens[b] and attends the positions P = [max(t + 1 - window, 0), t + 1)
    (all of [0, t + 1) when window is None), position p living in cache block
    block_tables[b, p // 16] at row p % 16:

        s_p = scale * q[b, i, h] . K[p]
        out[b, i, h] = sum_p exp(s_p) V[p] / (sum_p exp(s_p) + exp(sinks[h]))
        lse[b, i, h] = log(sum_p exp(s_p) + exp(sinks[h]))

    (no sink term when sinks is None), computed as the CUDA kernels do it:
    bf16 inputs, fp32 accumulation, P rounded to bf16 for P V. A token with no
    position (t < 0, e.g. ``seq_lens[b] == 0``) writes zeros and an lse of
    its sink (-inf without sinks). The CUDA kernels of this build serve head
    dim 128 (every group and query-token count, sinks or none, lse or none);
    other head dims run on CPU tensors and raise a clear error on CUDA ones.

    Non-finite values (docs/semantics.md): the formula in the limit. NaN in
    q[b, h] or sinks[h] makes that head NaN, in an attended K row the heads
    of its kv head, in an attended V element that dim of them. A logit of
    -inf (also q . K or its scaled value below -FLT_MAX) has no weight; all
    -inf give 0. A logit of +inf (or past FLT_MAX) makes the head NaN. A sink
    of +inf gives 0, of -inf no sink.

    Not differentiable: with grad mode on, a tensor that requires grad (an
    input or ``out``) raises; call it under ``torch.no_grad()`` or
    ``torch.inference_mode()``.

    CUDA-graph safe: the launch shape depends only on the batch size and the
    number of kv heads; sequence lengths and block tables are read on the device.

    Args:
        q: [B, num_heads, D] (one query token per request) or [B, Q,
            num_heads, D] (Q = 1 to 8) bf16 queries, D = 64, 128 or 256,
            num_heads = G * num_kv_heads with G = 1 to 16; the last dim
            contiguous, rows 16-byte aligned.
        kv_cache: [num_blocks, num_kv_heads, 16, 2 * D] HND cache with K in
            ``[..., :D]`` and V in ``[..., D:]``, bf16 or fp8
            (``torch.float8_e4m3fn``, storing x / scale); each (block, kv head)
            page contiguous and 16-byte aligned (a strided view of a larger
            allocation is fine).
        block_tables: [B, max_blocks] int32 block ids, rows contiguous.
        seq_lens: [B] int32 KV lengths including the current token (0 writes
            zeros). On the GPU, ``0 <= seq_lens[b] <= 16 * max_blocks`` and the
            block ids used are a contract, not checked (checking would need a
            sync); the CPU path checks them and raises. With programmatic
            dependent launch the kernel reads seq_lens, block_tables and sinks
            before the previous kernel on the stream has finished: that kernel
            must not write them (see the README; ``FLINT_PDL=0`` turns it off).
        sinks: [num_heads] fp32 sink logits, or None for none.
        window: attend to the last ``window`` positions (an int >= 1, a
            numpy integer too; not a bool, a float or a tensor), or None for all.
        scale: softmax scale, finite and > 0 (usually head_dim ** -0.5): a float or
            an int, a numpy number too; not a tensor. Under torch.compile a
            numpy window or scale makes the call run eagerly (with
            fullgraph=True it is an error): torch.compile traces numpy numbers
            as tensors.
        out: bf16 output of q's shape, written in place.
        k_scale, v_scale: with an fp8 cache only (and then both required):
            fp32 tensors of shape [1] (per tensor) or [num_kv_heads] on the
            cache's device, read on the device (a captured CUDA graph follows
            in-place changes); dequantized K = stored x k_scale, likewise V.
            Finite and > 0 (the CPU path checks; the GPU takes them on trust).
        lse: None, or an fp32 tensor of q's shape without its last dim,
            written in place with each query row's natural-log log-sum-exp
            (sink included): what merging partial results over shards of
            the context (context-parallel decode) needs. Give the sinks to
            one shard only.

    Returns:
        ``out``.
    """
    # The checks the dispatcher cannot make, at the cost of a few type tests
    # for plain tensors (C++ checks their devices); all of them for anything
    # else, fake tensors and torch.compile's tracing included. Window and
    # scale: the op's own checks (_with_scalar_checks) when eager; under
    # torch.compile here, in the traced code, so that numpy numbers become
    # Python ones before tracing makes them tensors, and a wrong type fails
    # as it does eagerly rather than while the graph runs on fake tensors.
    compiling = torch.compiler.is_compiling()
    if (
        compiling
        or type(q) is not _Tensor or type(kv_cache) is not _Tensor or type(block_tables) is not _Tensor
        or type(seq_lens) is not _Tensor or type(out) is not _Tensor
        or (sinks is not None and type(sinks) is not _Tensor)
        or (k_scale is not None and type(k_scale) is not _Tensor)
        or (v_scale is not None and type(v_scale) is not _Tensor)
        or (lse is not None and type(lse) is not _Tensor)
    ):
        _check_tensors(dict(q=q, kv_cache=kv_cache, block_tables=block_tables, seq_lens=seq_lens,
                            sinks=sinks, out=out, k_scale=k_scale, v_scale=v_scale, lse=lse))
    if compiling:
        window, scale = _window_arg(window), _scale_arg(scale)
    torch.ops.flint.decode_attention(
        q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, k_scale, v_scale, lse
    )
    return out


def _with_scalar_checks(op):
    """``op``, the C++ callable behind torch.ops.flint.decode_attention (or
    its .default), behind the wrapper's checks of window and scale.

    Python values reach the dispatcher through torch's conversion to the
    schema's types (``toIValue``), which takes whatever converts: for ``int?
    window`` a bool, a float numpy scalar or a tensor, through ``__index__``
    or ``__int__`` (``torch.tensor(8.7)`` runs as window 8); for ``float
    scale`` a tensor, through ``__float__``. By the time any kernel runs, C++
    or Python, the value is a plain number, so the check has to come before
    that conversion: here, in the callable that ``OpOverloadPacket.__call__``
    and ``OpOverload.__call__`` invoke (their ``_op``), so a direct call, the
    wrapper's call and the calls of a compiled graph or of FakeTensor all pass
    it. A call made through the C++ dispatcher (``redispatch``, C++ callers)
    gets no such conversion: it passes plain numbers already."""

    def decode_attention(*args, **kwargs):
        # The common case first: an int (or no) window and a float scale.
        if not (
            len(args) > 6 and type(args[6]) is float
            and (args[5] is None or type(args[5]) is int and _INT64_MIN <= args[5] <= _INT64_MAX)
        ):
            args, kwargs = list(args), dict(kwargs)
            for i, name, check in ((5, "window", _window_arg), (6, "scale", _scale_arg)):
                if i < len(args):
                    args[i] = check(args[i])
                elif name in kwargs:
                    kwargs[name] = check(kwargs[name])
        return op(*args, **kwargs)

    return decode_attention


# Both: calling the packet (torch.ops.flint.decode_attention(...)) goes to its
# own C++ callable, not through .default.
_PACKET = torch.ops.flint.decode_attention
_PACKET._op = _with_scalar_checks(_PACKET._op)
_PACKET.default._op = _with_scalar_checks(_PACKET.default._op)

# help(torch.ops.flint.decode_attention) and its __doc__: the wrapper's
# documentation, after what differs for a direct call.
_OP_DOC = f"""{torch.ops.flint.decode_attention.default._schema}

The operator behind ``flint_attention.flint_decode_attention``, which calls it
and returns ``out``; called directly it returns None. Both refuse a window or
scale of the wrong type (a bool, a float window, a tensor: the dispatcher would
read its value on the host) and take numpy numbers, except under
torch.compile, which traces them as tensors (pass Python numbers there; the
wrapper makes such a call run eagerly). The wrapper also checks, under
FakeTensorMode, that all tensors are on one device.

{inspect.cleandoc(flint_decode_attention.__doc__)}
"""
torch.ops.flint.decode_attention.__doc__ = _OP_DOC
torch.ops.flint.decode_attention.default.__doc__ = _OP_DOC
