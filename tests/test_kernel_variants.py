"""Every compiled variant of the CUDA kernel (warps x stages x merge path),
forced through FLINT_LAUNCH_CONFIG, against a float64 reference.

The heuristic alone reaches only a few variants for a given batch; forcing each
one keeps the tuning space correct, so the benchmark's sweeps compare only
right answers. Needs a Hopper GPU; skips elsewhere.
"""

import math
import os

import pytest
import torch

import flint_attention  # noqa: F401

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU; none here")

PAGE = 16

# splits, warps, stages, min_pages, cluster
CONFIGS = [
    "1,4,2,1,0",
    "1,8,2,2,0",
    "3,4,2,2,0",
    "7,4,3,1,0",
    "16,8,2,2,0",
    "5,8,3,1,0",
    "25,4,4,1,0",
    "4,4,2,1,1",
    "4,4,3,1,1",
    "8,4,2,1,1",
    "8,4,3,1,1",
]


def make_inputs(seq_lens, num_kv_heads, window, extra_blocks=5):
    """Random paged inputs; every cache slot no request attends to holds NaN or
    Inf, block ids are shuffled, out is prefilled with NaN."""
    dev = "cuda"
    batch = len(seq_lens)
    pages = [math.ceil(n / PAGE) for n in seq_lens]
    max_pages = max(max(pages), 1) + 1
    num_blocks = sum(pages) + extra_blocks
    kv = torch.randn(num_blocks, num_kv_heads, PAGE, 256, device=dev).to(torch.bfloat16)
    perm = torch.randperm(num_blocks, device=dev)
    bt = torch.full((batch, max_pages), -7, dtype=torch.int32)
    attended = torch.zeros(num_blocks, PAGE, dtype=torch.bool, device=dev)
    nxt = 0
    for b, n in enumerate(seq_lens):
        start = max(n - window, 0) if window is not None else 0
        ids = perm[nxt : nxt + pages[b]]
        nxt += pages[b]
        bt[b, : pages[b]] = ids.to(torch.int32).cpu()
        for pos in range(start, n):
            attended[ids[pos // PAGE], pos % PAGE] = True
        bt[b, pages[b] :] = int(perm[-1])  # valid id, never attended
    poison = torch.where(torch.rand(num_blocks, PAGE, device=dev) < 0.5, float("nan"), float("inf"))
    kv = torch.where(attended[:, None, :, None], kv, poison[:, None, :, None].to(torch.bfloat16))
    q = torch.randn(batch, 8 * num_kv_heads, 128, device=dev).to(torch.bfloat16)
    sinks = torch.randn(8 * num_kv_heads, device=dev) * 2
    out = torch.full_like(q, float("nan"))
    return q, kv, bt.to(dev), torch.tensor(seq_lens, dtype=torch.int32, device=dev), sinks, out


def reference(q, kv, bt, seq_lens, sinks, window, scale):
    """float64 attention with the sink as an extra logit in the denominator."""
    batch, num_heads, _ = q.shape
    out = torch.zeros(batch, num_heads, 128, dtype=torch.float64)
    for b in range(batch):
        n = int(seq_lens[b])
        start = max(n - window, 0) if window is not None else 0
        if n == 0:
            continue
        pos = torch.arange(start, n, device=kv.device)
        blocks = bt[b, pos // PAGE].long()
        rows = kv[blocks, :, pos % PAGE].double()  # [T, kvh, 256]
        k = rows[..., :128].repeat_interleave(8, dim=1)  # [T, H, 128]
        v = rows[..., 128:].repeat_interleave(8, dim=1)
        s = torch.einsum("hd,thd->ht", q[b].double(), k) * scale
        m = torch.maximum(s.max(dim=1).values, sinks.double())
        e = torch.exp(s - m[:, None])
        denom = e.sum(dim=1) + torch.exp(sinks.double() - m)
        out[b] = (torch.einsum("ht,thd->hd", e, v) / denom[:, None]).cpu()
    return out


def check(out, ref):
    out = out.double().cpu()
    assert torch.isfinite(out).all(), f"{(~torch.isfinite(out)).sum().item()} non-finite outputs"
    err = (out - ref).abs()
    rel = (out - ref).norm() / ref.norm().clamp_min(1e-30)
    idx = tuple(int(i) for i in torch.nonzero(err == err.max())[0])
    assert rel < 1e-2 and err.max() < 2**-6, f"rel {rel:.3e}, max abs {err.max():.3e} at {idx}"


@pytest.fixture
def launch_config():
    def set_config(cfg):
        os.environ["FLINT_LAUNCH_CONFIG"] = cfg

    yield set_config
    os.environ.pop("FLINT_LAUNCH_CONFIG", None)


@pytest.mark.parametrize("window", [None, 1, 37, 128, 5000])
@pytest.mark.parametrize("config", CONFIGS)
def test_variant_matches_reference(launch_config, config, window):
    seq_lens = [0, 1, 15, 16, 17, 33, 250, 1000, 4097, 129]
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, 2, window)
    scale = 128**-0.5
    # Eager call first: the workspace is allocated on a device's first call.
    launch_config(config)
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, scale, out)
    torch.cuda.synchronize()
    check(out, reference(q, kv, bt, sl, sinks, window, scale))
    first = out.clone()
    out.fill_(float("nan"))
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, scale, out)
    assert torch.equal(out, first), "a second run on the same inputs differs: a race"


@pytest.mark.parametrize("batch,num_kv_heads,window", [(1, 8, None), (2, 1, None), (4, 8, None),
                                                       (17, 2, None), (1, 8, 128), (16, 8, 128),
                                                       (64, 4, 128)])
def test_default_heuristic(batch, num_kv_heads, window):
    g = torch.Generator().manual_seed(batch * 31 + num_kv_heads)
    seq_lens = torch.randint(0, 3000, (batch,), generator=g).tolist()
    seq_lens[0] = 8192
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, num_kv_heads, window)
    scale = 128**-0.5
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, scale, out)
    torch.cuda.synchronize()
    check(out, reference(q, kv, bt, sl, sinks, window, scale))


def test_many_splits(launch_config):
    # 132 splits of one (request, kv head): what the heuristic picks for batch 1, 1 kv head.
    q, kv, bt, sl, sinks, out = make_inputs([20000, 3000, 0, 1], 1, None)
    launch_config("132,8,2,1,0")
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 0.07, out)
    torch.cuda.synchronize()
    check(out, reference(q, kv, bt, sl, sinks, None, 0.07))


def test_workspace_limit_is_an_error(launch_config):
    q, kv, bt, sl, sinks, out = make_inputs([100] * 20, 2, None)
    launch_config("33,4,2,1,0")  # 40 (request, kv head) pairs x 33 splits > 4 x SMs
    with pytest.raises(RuntimeError, match="workspace holds"):
        torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 0.1, out)


def test_unsupported_config_is_an_error(launch_config):
    q, kv, bt, sl, sinks, out = make_inputs([5], 1, None)
    launch_config("2,6,2,1,0")
    with pytest.raises(RuntimeError, match="no compiled kernel"):
        torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 0.1, out)
    launch_config("2,4")
    with pytest.raises(RuntimeError, match="FLINT_LAUNCH_CONFIG"):
        torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 0.1, out)
