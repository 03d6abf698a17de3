"""The op is not differentiable (csrc/ops/decode_attention_autograd.cpp): like
torch's out= functions it refuses, while grad mode is on, every tensor that
requires grad (an input, or out); under no_grad / inference_mode it runs. It
bumps out's version counter, as in-place writes do."""

from __future__ import annotations

import pytest
import torch
from conftest import run_op

from flint_attention import flint_decode_attention
from flint_attention.testing import FP8, make_paged_inputs


def inputs(device, fp8=False):
    kw = dict(kv_dtype=FP8, k_scale=0.01, v_scale=[0.01, 0.02]) if fp8 else {}
    return make_paged_inputs(2, [30, 5], 2, None, device, **kw)


@pytest.mark.parametrize("name", ["q", "kv_cache", "sinks", "k_scale", "v_scale", "out"])
def test_a_tensor_that_requires_grad_raises(device, name):
    inp = inputs(device, fp8=name in ("k_scale", "v_scale"))
    inp = inp._replace(**{name: getattr(inp, name).detach().clone().requires_grad_()})
    before = inp.out.clone()
    with pytest.raises(RuntimeError, match=rf"flint.decode_attention is not differentiable .*but {name} requires grad; call it under torch.no_grad\(\)"):
        run_op(inp, None)
    assert torch.equal(inp.out.detach().isnan(), before.isnan()), "out untouched"


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_runs_without_grad_mode(device, mode):
    inp = inputs(device)
    expected = run_op(inp, None).clone()
    q = inp.q.clone().requires_grad_()
    out = torch.full_like(inp.out, float("nan")).requires_grad_()  # a leaf that requires grad
    with getattr(torch, mode)():
        flint_decode_attention(q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, None,
                               128**-0.5, out)
    assert torch.equal(out.detach(), expected)
    assert out.grad_fn is None and q.grad is None


def test_out_version_counter_bumps(device):
    inp = inputs(device)
    version = inp.out._version
    run_op(inp, None)
    assert inp.out._version == version + 1
