"""The diagnostic op flint_testing::decode_attention_timeline
(benchmarks/timeline.py): it computes exactly what the operator computes, and
every CTA's stamps are in phase order."""

from __future__ import annotations

import pytest
import torch
from conftest import needs_hopper
from conftest import cuda_inputs as make_inputs

pytestmark = needs_hopper
STAMPS = 9
SCALE = 128**-0.5


@pytest.mark.parametrize("config,seq_lens,window", [
    ("16,8,2,1,0", [5000, 0, 17], None),  # last-CTA merge, inactive splits, seq_len 0
    ("33,9,2,1,0", [8192, 3, 0], None),  # a warp that only streams
    ("3,4,3,1,0", [300, 40], None),
    ("8,4,2,1,1", [900, 1], 128),  # cluster of 8
    ("0,4,2,1,0", [0, 700, 17, 129, 5], 128),  # one warp per (request, kv head)
    ("0,4,3,1,0", [64, 3000, 1], None),
])
def test_timeline_matches_operator_and_is_ordered(launch_config, config, seq_lens, window):
    q, kv, bt, sl, sinks, out = make_inputs(seq_lens, 2, window)
    launch_config(config)
    torch.ops.flint.decode_attention(q, kv, bt, sl, sinks, window, SCALE, out)
    splits, warps = (int(x) for x in config.split(",")[:2])
    pairs = len(seq_lens) * 2
    ctas = -(-pairs // warps) if splits == 0 else pairs * splits
    timeline = torch.zeros(ctas, STAMPS, 2, dtype=torch.int64, device="cuda")
    traced = torch.full_like(out, float("nan"))
    torch.ops.flint_testing.decode_attention_timeline(q, kv, bt, sl, sinks, window, SCALE, traced,
                                                      timeline)
    torch.cuda.synchronize()
    assert torch.equal(traced, out), "the timeline variant computes something else"
    t = timeline.cpu()
    assert (t[:, 0, 0] != 0).all(), "a CTA did not stamp its entry"
    for cta in t:
        written = cta[:, 0] != 0
        ns, clk = cta[written, 0], cta[written, 1]
        assert (ns[1:] >= ns[:-1]).all() and (clk[1:] >= clk[:-1]).all(), f"stamps out of order: {cta}"


def test_timeline_errors(launch_config):
    q, kv, bt, sl, sinks, out = make_inputs([100], 1, None)
    launch_config("16,4,3,1,1")  # no timeline variant for a 16-rank cluster
    with pytest.raises(RuntimeError, match="unsupported launch configuration"):
        torch.ops.flint_testing.decode_attention_timeline(
            q, kv, bt, sl, sinks, None, SCALE, out, torch.zeros(16 * STAMPS * 2, dtype=torch.int64,
                                                                device="cuda"))
    launch_config("8,8,2,1,0")
    with pytest.raises(RuntimeError, match="timeline must be a contiguous int64 tensor"):
        torch.ops.flint_testing.decode_attention_timeline(
            q, kv, bt, sl, sinks, None, SCALE, out, torch.zeros(10, dtype=torch.int64, device="cuda"))
