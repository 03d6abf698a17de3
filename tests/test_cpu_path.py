"""The CPU path implements the kernel's numerics contract bit for bit, so that
the GPU can be held to it with a tight bound.

An emulation of the contract in numpy float32 (libm's exp2f and fmaf through
ctypes, the same order of sums) must give the same bits. q and K hold small
integers so the dot products are exact whatever their summation order.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest
import torch
from conftest import run_op

from flint_attention.ops import GQA, HEAD_DIM, PAGE_TOKENS
from flint_attention.testing import FP8, attended_span, make_paged_inputs

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.exp2f.restype = ctypes.c_float
_libm.exp2f.argtypes = [ctypes.c_float]
_libm.fmaf.restype = ctypes.c_float
_libm.fmaf.argtypes = [ctypes.c_float] * 3

LOG2E = 1.4426950408889634
f32 = np.float32


def to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bf16, returned as float32."""
    return torch.from_numpy(np.asarray(x, dtype=f32)).bfloat16().float().numpy()


def to_f16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to fp16 (subnormals kept), returned as float32."""
    return torch.from_numpy(np.asarray(x, dtype=f32)).half().float().numpy()


def emulate_kernel(inp, window, scale) -> torch.Tensor:
    """The numerics contract of the kernel, one (request, head) at a time. An
    fp8 cache is used as stored; k_scale multiplies the fp32 softmax scale,
    v_scale the fp32 normalization, and P is rounded to fp16 instead of bf16
    (q holds small integers here: its power-of-two scale is 1)."""
    fp8 = inp.kv_cache.dtype == torch.float8_e4m3fn
    round_p = to_f16 if fp8 else to_bf16
    q = inp.q.float().numpy()
    kv = inp.kv_cache.float().numpy()
    table = inp.block_tables.numpy()
    sinks = inp.sinks.numpy()
    kvh = kv.shape[1]
    ones = np.ones(kvh, dtype=f32)
    k_scale = ones if inp.k_scale is None else np.broadcast_to(inp.k_scale.numpy(), (kvh,))
    v_scale = ones if inp.v_scale is None else np.broadcast_to(inp.v_scale.numpy(), (kvh,))
    out = np.zeros(q.shape, dtype=f32)
    for b, seq_len in enumerate(inp.seq_lens.tolist()):
        span = attended_span(seq_len, window)
        for h in range(q.shape[1]):
            if len(span) == 0:
                continue
            # rounded once from double, as the kernel gets it, then times k_scale in fp32
            c = f32(f32(scale * LOG2E) * f32(k_scale[h // GQA]))
            rows = [kv[table[b, p // PAGE_TOKENS], h // GQA, p % PAGE_TOKENS] for p in span]
            s = [f32(np.dot(q[b, h].astype(np.float64), r[:HEAD_DIM])) for r in rows]  # exact
            ms = f32(max(s) * c)
            shift = f32(0) if ms == -np.inf else ms  # every logit -inf: no NaN from -inf - -inf
            l, o = f32(0), np.zeros(HEAD_DIM, dtype=f32)
            for s_p, row in zip(s, rows):
                p = f32(_libm.exp2f(_libm.fmaf(s_p, c, -shift)))
                l = f32(l + p)
                o = o + round_p(p) * row[HEAD_DIM:]
            inv = f32(v_scale[h // GQA]) / f32(l + f32(_libm.exp2f(f32(sinks[h]) * f32(LOG2E) - ms)))
            out[b, h] = o * inv
    return torch.from_numpy(out).bfloat16()


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("scale", [128**-0.5, 0.3])
def test_matches_kernel_numerics_bitwise(window, scale, kv_dtype):
    fp8 = dict(kv_dtype=FP8, k_scale=[0.7, 3.0], v_scale=[1.5, 0.01]) if kv_dtype == "fp8" else {}
    inp = make_paged_inputs(4, [0, 1, 19, 70], 2, window, "cpu", strided_cache=True, **fp8)
    ints = lambda t: torch.randint(-2, 3, t.shape).float()  # noqa: E731
    inp.q.copy_(ints(inp.q))
    keys = inp.kv_cache[..., :HEAD_DIM]
    wide = keys.float()
    keys.copy_(torch.where(wide.isfinite(), ints(keys), wide).to(keys.dtype))  # keep the poison
    out = run_op(inp, window, scale)
    expected = emulate_kernel(inp, window, scale)
    mismatch = (out.view(torch.int16) != expected.view(torch.int16)).nonzero()
    assert len(mismatch) == 0, f"{len(mismatch)} coordinates differ, first {mismatch[0].tolist()}"


def test_minus_inf_logits_bitwise():
    # Request 1's logits are all -inf (a -inf key element times q > 0), request
    # 2's partly: the shift of 0 instead of -inf (docs/semantics.md).
    inp = make_paged_inputs(3, [33, 40, 50], 1, None, "cpu", shuffle_blocks=False, poison=False)
    ints = lambda t: torch.randint(-2, 3, t.shape).float()  # noqa: E731
    inp.q.copy_(ints(inp.q))
    inp.q[..., 0] = 1
    keys = inp.kv_cache[..., :HEAD_DIM]
    keys.copy_(ints(keys))
    table = inp.block_tables
    keys[table[1, :3].long(), :, :, 0] = -torch.inf  # positions 0..47 of request 1
    keys[table[2, 1].long(), :, 3:9, 0] = -torch.inf  # positions 19..24 of request 2
    out = run_op(inp, None)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and out[2].isfinite().all()
    assert torch.equal(out.view(torch.int16), emulate_kernel(inp, None, 128**-0.5).view(torch.int16))


def test_thread_count_does_not_change_bits():
    inp = make_paged_inputs(9, [0, 5, 16, 17, 300, 1000, 33, 2, 64], 4, None, "cpu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = run_op(inp, None).clone()
        torch.set_num_threads(max(threads, 2))
        multi = run_op(inp, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, multi)
