"""Every compiled variant of the CUDA kernel (warps x stages x merge path),
forced through FLINT_LAUNCH_CONFIG, against a float64 reference.

The heuristic alone reaches only a few variants for a given batch; forcing each
one keeps the tuning space correct, so the benchmark's sweeps compare only
right answers. Needs a Hopper GPU; skips elsewhere.
"""

import pytest
import torch
from conftest import cuda_inputs as make_inputs
from conftest import check_vs_f64 as check
from conftest import needs_hopper

from flint_attention.testing import make_paged_inputs
from flint_attention.testing import reference_decode_attention as reference

pytestmark = needs_hopper

# splits, warps, stages, min_pages, cluster
CONFIGS = [
    "1,4,2,1,0",
    "1,8,2,2,0",
    "3,4,2,2,0",
    "7,4,3,1,0",
    "16,8,2,2,0",
    "5,8,3,1,0",
    "25,4,4,1,0",
    "16,9,2,1,0",  # 9 and 10 warps: the 9th and 10th only stream, 8 merge
    "13,10,2,2,0",
    "4,4,2,1,1",
    "4,4,3,1,1",
    "8,4,2,1,1",
    "8,4,3,1,1",
    "4,8,2,1,1",
    "4,8,3,1,1",
    "8,8,2,1,1",
    "8,8,3,1,1",
    "16,4,3,1,1",  # 16 ranks: a non-portable cluster size
    "16,8,2,1,1",  # 16 ranks of 8 warps: half the threads merge none of the dims
    # splits 0: one warp per (request, kv head), decode_attention_warp_per_head_kernel
    "0,4,2,1,0",
    "0,4,3,1,0",
    "0,4,4,1,0",
    "0,8,2,1,0",
    "0,8,3,1,0",
]


def check_twice(q, kv, bt, sl, sinks, window, scale, out):
    """Calls the op, checks `out` against the float64 reference, then calls it
    again on the same inputs: a result that differs bitwise is a race."""
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, scale, out)
    torch.cuda.synchronize()
    check(out, reference(q, kv, bt, sl, sinks, window, scale))
    first = out.clone()
    out.fill_(float("nan"))
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, scale, out)
    assert torch.equal(out, first), "a second run on the same inputs differs: a race"


@pytest.mark.parametrize("window", [None, 1, 37, 128, 5000])
@pytest.mark.parametrize("config", CONFIGS)
def test_variant_matches_reference(launch_config, config, window):
    seq_lens = [0, 1, 15, 16, 17, 33, 250, 1000, 4097, 129]
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, 2, window)
    scale = 128**-0.5
    # Eager call first: the workspace is allocated on a device's first call.
    launch_config(config)
    check_twice(q, kv, bt, sl, sinks, window, scale, out)


@pytest.mark.parametrize("batch,num_kv_heads,window", [(1, 8, None), (2, 1, None), (4, 8, None),
                                                       (17, 2, None), (1, 8, 128), (16, 8, 128),
                                                       (64, 4, 128), (64, 8, 128), (133, 8, 128)])
def test_default_heuristic(batch, num_kv_heads, window):
    g = torch.Generator().manual_seed(batch * 31 + num_kv_heads)
    seq_lens = torch.randint(0, 3000, (batch,), generator=g).tolist()
    seq_lens[0] = 8192
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, num_kv_heads, window)
    scale = 128**-0.5
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, scale, out)
    torch.cuda.synchronize()
    check(out, reference(q, kv, bt, sl, sinks, window, scale))


@pytest.mark.parametrize("seq_lens", [[20000], [20000, 3000, 0, 1]])
def test_many_splits(launch_config, seq_lens):
    # 132 splits of one (request, kv head): all active for one request on 132
    # SMs (the most one split merge sees), a quarter of them with 4.
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, 1, None)
    launch_config("132,8,2,1,0")
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 0.07, out)
    torch.cuda.synchronize()
    check(out, reference(q, kv, bt, sl, sinks, None, 0.07))


@pytest.mark.parametrize("config", ["16,9,2,1,0", "33,9,2,4,0", "16,10,2,1,0", "13,10,2,1,0"])
def test_extra_warps_stream_where_they_save_splits(launch_config, config):
    # 9 or 10 warps per split, 5 pairs: at L 8192 all of them stream where
    # the launch has splits to spare (15 of 9 or 13 of 10 instead of 16 of
    # 8; with 13 launched, 8 of 10 do), at L 20000 only the 8 that merge (as
    # few splits either way); one launch holds both, and empty and one-page
    # requests.
    q, kv, bt, sl, sinks, out = make_inputs([8192, 20000, 3, 0, 8000], 1, None)
    launch_config(config)
    check_twice(q, kv, bt, sl, sinks, None, 128**-0.5, out)


def test_splits_past_one_wave_stay_idle(launch_config):
    # The split kernel keeps at most the CTAs the GPU holds at once active
    # (one 8-warp CTA per SM): a grid twice that size computes bit for bit
    # what the one-wave grid computes, the extra CTAs leave at once.
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kvh = 8
    q, kv, bt, sl, sinks, out = make_inputs([8192, 3000], kvh, None)
    cap = sms // (2 * kvh)
    launch_config(f"{cap},8,2,1,0")
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 0.07, out)
    one_wave = out.clone()
    launch_config(f"{2 * cap},8,2,1,0")
    out.fill_(float("nan"))
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 0.07, out)
    torch.cuda.synchronize()
    assert torch.equal(out, one_wave), "splits past one wave changed the result"
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
    launch_config("0,4,2,1,1")  # warp-per-head has no cluster
    with pytest.raises(RuntimeError, match="a cluster merge needs num_splits > 0"):
        torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 0.1, out)


@pytest.mark.parametrize("config", [None, "8,8,2,1,0", "5,4,3,1,0", "1,4,2,2,0", "4,4,2,1,1",
                                    "8,4,2,1,1", "0,4,3,1,0", "0,8,2,1,0"])
@pytest.mark.parametrize("window", [None, 128])
def test_back_to_back_calls(launch_config, config, window):
    # Each call lets its PDL successor launch once past griddepcontrol.wait;
    # four calls on four input sets, queued without a sync (a successor's
    # prologue overlaps the call before it, which still uses the shared
    # workspace), must each give the right answer.
    launch_config(config)
    scale = 128**-0.5
    sets = []
    for i in range(4):
        seq_lens = torch.randint(0, 5000, (24,)).tolist()
        seq_lens[i] = 0
        sets.append(make_inputs(seq_lens, 2, window))
    for q, kv, bt, sl, sinks, out in sets:
        torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, scale, out)
    torch.cuda.synchronize()
    for q, kv, bt, sl, sinks, out in sets:
        check(out, reference(q, kv, bt, sl, sinks, window, scale))


@pytest.mark.parametrize("config", ["0,4,2,1,0", "0,4,3,1,0", "0,4,4,1,0", "0,8,2,1,0",
                                    "0,8,3,1,0"])
@pytest.mark.parametrize("window,max_len", [(None, 700), (128, 3000), (None, 40), (64, 3000)])
def test_persistent_warp_per_head(launch_config, config, window, max_len):
    # More (request, kv head) pairs than the GPU holds warps, so warps loop
    # over pairs and their rings go on from pair to pair, the next pair's
    # leading pages issued by this pair's stream (empty requests in between;
    # max_len 40 and window 64: pairs shorter than the ring's leading pages,
    # which the chain skips); twice, for determinism.
    launch_config(config)
    seq_lens = torch.randint(0, max_len, (300,)).tolist()
    for i in range(0, 300, 37):
        seq_lens[i] = 0
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, 8, window)
    check_twice(q, kv, bt, sl, sinks, window, 128**-0.5, out)


@pytest.mark.parametrize("max_blocks", [64, 65, 512])
@pytest.mark.parametrize("batch,kvh", [(1, 8), (8, 1), (2, 4)])
def test_heuristic_follows_block_table_width(launch_config, max_blocks, batch, kvh):
    # The heuristic takes the 8-rank cluster when the block tables hold at
    # most 1024 tokens (64 pages) and <= 8 (request, kv head) pairs, the split
    # kernel otherwise: both must give the right answer for the same lengths.
    launch_config(None)
    seq_lens = torch.randint(0, 16 * 64 + 1, (batch,)).tolist()
    seq_lens[0] = 16 * 64  # the longest the narrowest table holds
    inp = make_paged_inputs(batch, seq_lens, kvh, None, "cuda", max_blocks=max_blocks)
    check_twice(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, None, 128**-0.5,
                inp.out)


# The ring refilled before or after the wait, or after it only in the warps
# whose first page has arrived by then (the launch picks one per
# configuration; FLINT_REFILL_AFTER_WAIT forces each), clusters and
# persistent warps included.
@pytest.mark.parametrize("config", ["16,8,2,1,0", "7,4,3,1,0", "25,4,4,1,0", "8,4,2,1,1",
                                    "0,4,3,1,0", "0,8,2,1,0"])
@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("refill_after_wait", ["0", "1", "2"])
def test_refill_after_wait(launch_config, monkeypatch, config, window, refill_after_wait):
    monkeypatch.setenv("FLINT_REFILL_AFTER_WAIT", refill_after_wait)
    launch_config(config)
    seq_lens = [0, 1, 15, 16, 17, 33, 250, 1000, 4097, 129]
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, 2, window)
    check_twice(q, kv, bt, sl, sinks, window, 128**-0.5, out)
    # Persistent warps chain their rings from pair to pair too.
    if config.startswith("0,"):
        seq_lens = torch.randint(0, 3000, (300,)).tolist()
        q, kv, bt, sl, sinks, out = make_inputs(seq_lens, 8, window)
        check_twice(q, kv, bt, sl, sinks, window, 128**-0.5, out)


def test_refill_after_wait_rejects_other_values(monkeypatch):
    monkeypatch.setenv("FLINT_REFILL_AFTER_WAIT", "yes")
    q, kv, bt, sl, sinks, out = make_inputs([5], 1, None)
    with pytest.raises(RuntimeError, match="FLINT_REFILL_AFTER_WAIT must be 0, 1 or 2"):
        torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, None, 128**-0.5, out)
