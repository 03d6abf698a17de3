"""Several GPUs in one process: each device gets its own workspace (split
partials and arrival counters), the kernel runs on the tensors' device whatever
the current device is, and a graph captured on one device keeps working while
the other device runs eagerly. Skips without two Hopper GPUs.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import HOPPER_SKIP_REASON, check_output, run_op

from flint_attention.testing import FP8, make_paged_inputs


def _two_hopper_skip_reason() -> str | None:
    if HOPPER_SKIP_REASON is not None:
        return HOPPER_SKIP_REASON
    if torch.cuda.device_count() < 2:
        return f"needs two Hopper (sm_90) GPUs; found {torch.cuda.device_count()}"
    if torch.cuda.get_device_capability(1) != (9, 0):
        return f"needs two Hopper (sm_90) GPUs; cuda:1 is {torch.cuda.get_device_name(1)}"
    return None


pytestmark = pytest.mark.skipif(_two_hopper_skip_reason() is not None,
                                reason=str(_two_hopper_skip_reason()))
DEVICES = ["cuda:0", "cuda:1"]


def _sync_all() -> None:
    for dev in DEVICES:
        torch.cuda.synchronize(dev)


@pytest.mark.parametrize("shape", [dict(), dict(group=12, q_tokens=3, with_lse=True)], ids=["g8", "g12_q3"])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("window", [None, 128])
def test_alternating_devices_share_nothing(window, kv, shape):
    # With full attention, batch 1 and 4 use several splits and the last-CTA
    # merge, so each call leans on its device's counters (with window 128 the
    # cluster merge and single splits: no counters), and batch 16 the
    # balanced kernel's cross-CTA merges; the current device stays cuda:0
    # while half the calls run on cuda:1 tensors.
    configs = [(1, [9000]), (4, [5000, 17, 0, 3000]), (1, [300]),
               (16, [(997 * i) % 6000 for i in range(16)])]
    fp8 = dict(kv_dtype=FP8, k_scale=[0.02] * 8, v_scale=0.03) if kv == "fp8" else {}
    inputs = []
    for step in range(8):
        batch, lens = configs[step % len(configs)]
        inputs += [(make_paged_inputs(batch, lens, 8, window, dev, **fp8, **shape), dev) for dev in DEVICES]
    _sync_all()
    with torch.cuda.device(0):
        for inp, _ in inputs:
            run_op(inp, window)
    _sync_all()
    for i, (inp, dev) in enumerate(inputs):
        assert inp.out.device == torch.device(dev)
        check_output(inp.out, inp, window, what=f"call {i} on {dev}")


def test_graph_on_one_device_eager_on_the_other():
    # The first call on each device allocates its workspace eagerly; then a
    # graph captured on cuda:1 replays between eager calls on cuda:0.
    window = None
    live = make_paged_inputs(2, [4097, 1], 8, window, "cuda:1", num_blocks=700, max_blocks=300)
    news = [make_paged_inputs(2, lens, 8, window, "cuda:1", num_blocks=700, max_blocks=300)
            for lens in ([17, 4000], [0, 2], [3000, 3000])]
    eager = [make_paged_inputs(1, [n], 8, window, "cuda:0") for n in (8000, 33, 1)]
    _sync_all()
    with torch.cuda.device(1):
        run_op(live, window)
        torch.cuda.synchronize()
        check_output(live.out, live, window, what="eager warm-up on cuda:1")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_op(live, window)
    for step, (new, other) in enumerate(zip(news, eager)):
        for name in ("q", "kv_cache", "block_tables", "seq_lens", "sinks"):
            getattr(live, name).copy_(getattr(new, name))
        live.out.fill_(math.nan)
        with torch.cuda.device(1):
            graph.replay()
        run_op(other, window)  # on cuda:0, meanwhile
        _sync_all()
        check_output(live.out, new, window, what=f"replay {step} on cuda:1")
        check_output(other.out, other, window, what=f"eager call {step} on cuda:0")
