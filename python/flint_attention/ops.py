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
import operator

import torch

from flint_attention import _C

HEAD_DIM = 128
GQA = 8
PAGE_TOKENS = 16

# Whether this build has the CUDA kernel (setup.py builds without it where
# there is no nvcc, or with FLINT_CPU_ONLY=1; CUDA tensors then raise).
HAS_CUDA_KERNEL = bool(_C.HAS_CUDA_KERNEL)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_Tensor = torch.Tensor


def _what(x) -> str:
    return "None" if x is None else f"a {type(x).__name__}"


def _check_tensors(tensors: dict) -> None:
    """Raises for anything but a tensor where the op takes one (None becomes
    an undefined tensor in the dispatcher), and for tensors on several
    devices: the C++ check's words, for fake tensors, which are all on the
    meta device to C++."""
    for name, t in tensors.items():
        optional = name in ("k_scale", "v_scale")
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


def _check_window(window):
    """A window the dispatcher would take otherwise (a bool as 1 or 0) or not
    at all (past int64); returns it as an int (numpy integers included)."""
    if isinstance(window, torch.SymInt):
        return window
    if isinstance(window, bool):
        raise TypeError(f"flint.decode_attention: window must be None or an int, got {window} (a bool)")
    if not isinstance(window, int):
        try:
            window = operator.index(window)
        except TypeError:
            raise TypeError(f"flint.decode_attention: window must be None or an int, got {_what(window)}") from None
    if not _INT64_MIN <= window <= _INT64_MAX:
        raise RuntimeError(
            "flint.decode_attention: window must be None or >= 1 and fit int64 (<= 2**63 - 1; any "
            f"window >= seq_len attends to every position), got {window}"
        )
    return window


def flint_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: torch.Tensor,
    window: int | None,
    scale: float,
    out: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged decode attention with sinks, one query token per request.

    For each request b and query head h (kv head h // 8), with L = seq_lens[b]
    and the attended positions P = [max(L - window, 0), L) (all of [0, L) when
    window is None), position p living in cache block block_tables[b, p // 16]
    at row p % 16:

        s_p = scale * q[b, h] . K[p]
        out[b, h] = sum_p exp(s_p) V[p] / (sum_p exp(s_p) + exp(sinks[h]))

    computed as the CUDA kernel does it: bf16 inputs, fp32 accumulation, P
    rounded to bf16 for P V. ``seq_lens[b] == 0`` writes zeros.

    Non-finite values (README, Semantics): the formula in the limit. NaN in
    q[b, h] or sinks[h] makes that head NaN, in an attended K row the 8 heads
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
        q: [B, num_heads, 128] bf16 queries, num_heads = 8 * num_kv_heads; the
            last dim contiguous, rows 16-byte aligned.
        kv_cache: [num_blocks, num_kv_heads, 16, 256] HND cache with K in
            ``[..., :128]`` and V in ``[..., 128:]``, bf16 or fp8
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
        sinks: [num_heads] fp32 sink logits.
        window: attend to the last ``window`` positions (an int >= 1; not a
            bool), or None for all.
        scale: softmax scale, finite and > 0 (usually 128 ** -0.5).
        out: [B, num_heads, 128] bf16 output, written in place.
        k_scale, v_scale: with an fp8 cache only (and then both required):
            fp32 tensors of shape [1] (per tensor) or [num_kv_heads] on the
            cache's device, read on the device (a captured CUDA graph follows
            in-place changes); dequantized K = stored x k_scale, likewise V.
            Finite and > 0 (the CPU path checks; the GPU takes them on trust).

    Returns:
        ``out``.
    """
    # The checks the dispatcher cannot make, at the cost of a few type tests
    # for plain tensors and an int window (C++ checks their devices); all of
    # them for anything else, fake tensors and torch.compile's tracing included.
    if (
        type(q) is not _Tensor or type(kv_cache) is not _Tensor or type(block_tables) is not _Tensor
        or type(seq_lens) is not _Tensor or type(sinks) is not _Tensor or type(out) is not _Tensor
        or (k_scale is not None and type(k_scale) is not _Tensor)
        or (v_scale is not None and type(v_scale) is not _Tensor)
        or torch.compiler.is_compiling()
    ):
        _check_tensors(dict(q=q, kv_cache=kv_cache, block_tables=block_tables, seq_lens=seq_lens,
                            sinks=sinks, out=out, k_scale=k_scale, v_scale=v_scale))
    if window is not None and (type(window) is not int or not _INT64_MIN <= window <= _INT64_MAX):
        window = _check_window(window)
    torch.ops.flint.decode_attention(
        q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, k_scale, v_scale
    )
    return out


# help(torch.ops.flint.decode_attention) and its __doc__: the wrapper's
# documentation, after what differs for a direct call.
_OP_DOC = f"""{torch.ops.flint.decode_attention.default._schema}

The operator behind ``flint_attention.flint_decode_attention``, which calls it
and returns ``out``; called directly it returns None. The wrapper also rejects
what the dispatcher passes on as an int (``window=True`` runs as window 1
here) or cannot carry (a window past int64), and under FakeTensorMode checks
the tensors' devices.

{inspect.cleandoc(flint_decode_attention.__doc__)}
"""
torch.ops.flint.decode_attention.__doc__ = _OP_DOC
torch.ops.flint.decode_attention.default.__doc__ = _OP_DOC
