"""How the op is registered: schema, backends, the Meta kernel FakeTensor and
torch.compile run, opcheck, torch.compile, the op's docstring."""

from __future__ import annotations

import pydoc

import pytest
import torch
from conftest import run_op
from torch._subclasses.fake_tensor import FakeTensorMode

from flint_attention import flint_decode_attention
from flint_attention.testing import make_paged_inputs

OP = "flint::decode_attention"


def test_schema():
    assert str(torch.ops.flint.decode_attention.default._schema) == (
        "flint::decode_attention(Tensor q, Tensor kv_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor? sinks, int? window, float scale, Tensor(a!) out, "
        "Tensor? k_scale=None, Tensor? v_scale=None, Tensor(b!)? lse=None) -> ()"
    )


@pytest.mark.parametrize("key", ["CPU", "CUDA", "Meta", "Autograd"])
def test_backend_registered(key):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(OP, key)


def test_fake_is_the_cpp_meta_kernel():
    # No Python fake: FakeTensorMode runs the C++ Meta kernel, i.e. the real checks.
    assert torch._library.simple_registry.singleton.find(OP).fake_impl.kernel is None


def test_op_docstring():
    doc = torch.ops.flint.decode_attention.__doc__
    assert doc.startswith(str(torch.ops.flint.decode_attention.default._schema))
    assert "Paged decode attention with optional sinks" in doc and "Non-finite" in doc
    assert torch.ops.flint.decode_attention.default.__doc__ == doc
    assert "Paged decode attention with optional sinks" in pydoc.render_doc(torch.ops.flint.decode_attention)


def sample_inputs(device):
    for batch, lens, kvh, window in [
        (1, [17], 1, None),
        (3, [0, 33, 100], 2, 64),
        (2, [1, 16], 8, 1),
    ]:
        inp = make_paged_inputs(batch, lens, kvh, window, device, shared_pages=True)
        yield (inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, window, 0.125, inp.out)


def test_opcheck(device):
    for args in sample_inputs(device):
        torch.library.opcheck(torch.ops.flint.decode_attention.default, args)


def test_fake_tensor_mode(device):
    inp = make_paged_inputs(3, [5, 0, 40], 2, None, device)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = [mode.from_tensor(t) for t in inp[:6]]
        q, kv_cache, block_tables, seq_lens, sinks, out = fake
        result = flint_decode_attention(q, kv_cache, block_tables, seq_lens, sinks, 16, 0.1, out)
    assert result is out and result.shape == inp.q.shape and result.device == inp.q.device


def test_fake_rejects_wrong_shapes():
    inp = make_paged_inputs(2, [5, 6], 1, None, "cpu")
    with FakeTensorMode() as mode:
        q, kv_cache, block_tables, seq_lens, sinks = (mode.from_tensor(t) for t in inp[:5])
        bad_out = mode.from_tensor(torch.empty(2, 16, 128, dtype=torch.bfloat16))
        with pytest.raises(RuntimeError, match="out must have the shape of q"):
            flint_decode_attention(q, kv_cache, block_tables, seq_lens, sinks, None, 0.1, bad_out)


def test_fake_rejects_wrong_dtypes_and_devices():
    inp = make_paged_inputs(2, [5, 6], 1, None, "cpu")
    long_lens = inp.seq_lens.long()
    with FakeTensorMode() as mode:
        q, kv_cache, block_tables, seq_lens, sinks, out = (mode.from_tensor(t) for t in inp[:6])
        with pytest.raises(RuntimeError, match="seq_lens must be Int, got Long"):
            flint_decode_attention(q, kv_cache, block_tables, mode.from_tensor(long_lens), sinks,
                                   None, 0.1, out)
        meta_q = torch.empty(2, 8, 128, dtype=torch.bfloat16, device="meta")
        with pytest.raises(RuntimeError, match="all tensors must be on one device"):
            flint_decode_attention(mode.from_tensor(meta_q), kv_cache, block_tables, seq_lens,
                                   sinks, None, 0.1, out)


def test_torch_compile_fullgraph(device):
    inp = make_paged_inputs(3, [9, 0, 70], 2, 32, device)

    def step(q, kv_cache, block_tables, seq_lens, sinks, out):
        attn = flint_decode_attention(q, kv_cache, block_tables, seq_lens, sinks, 32, 0.125, out)
        return attn * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    expected = step(*inp[:6]).clone()
    eager_out = inp.out.clone()
    inp.out.fill_(float("nan"))
    result = compiled(*inp[:6])
    assert torch.equal(result, expected)
    assert torch.equal(inp.out, eager_out), "the compiled call must write out in place"


def test_torch_compile_dynamic_shapes(device):
    # Symbolic batch and block counts reach the Meta kernel's checks as SymInts.
    def step(q, kv_cache, block_tables, seq_lens, sinks, out):
        return flint_decode_attention(q, kv_cache, block_tables, seq_lens, sinks, None, 0.125, out) + 1

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for batch, lens in [(3, [9, 0, 70]), (5, [1, 2, 300, 17, 16])]:
        inp = make_paged_inputs(batch, lens, 2, None, device)
        expected = step(*inp[:6]).clone()
        inp.out.fill_(float("nan"))
        assert torch.equal(compiled(*inp[:6]), expected)
    bad = make_paged_inputs(4, [1, 2, 3, 4], 2, None, device)
    with pytest.raises(RuntimeError, match=r"seq_lens must have \w+ entries \(the batch size of q\)"):
        compiled(bad.q, bad.kv_cache, bad.block_tables, bad.seq_lens[:3], bad.sinks, bad.out)


def test_wrapper_returns_out(device):
    inp = make_paged_inputs(1, [3], 1, None, device)
    assert run_op(inp, None) is inp.out
