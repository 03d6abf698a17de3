"""The launch plan's rules (csrc/decode_attention/launch_plan.cpp) over many
shapes and SM counts, on the host: flint_testing.plan_for_shape runs
plan_launch with no tensor and no GPU, so every CI run checks the rules that
the GPU tests (test_kernel_variants.py's test_default_plan) can only check on
one device's SM count. The plan may read the batch size, kv heads, window,
cache dtype and SM count, never the lengths or the block tables.
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import TESTING_SKIP_REASON

from flint_attention.testing import plans

if TESTING_SKIP_REASON is not None:
    pytest.skip(TESTING_SKIP_REASON, allow_module_level=True)

BATCHES = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 34, 64, 128, 512, 4096, 65535, 65536]
KV_HEADS = [1, 2, 3, 4, 8, 16, 64]
WINDOWS = [None, 1, 16, 17, 128, 129, 256, 257, 512, 1024, 2048, 4096, 131072, 2**40]
SMS = [132, 114, 78, 16, 1]  # H200 / H100 SXM, H100 PCIe, and smaller parts


def compiled(plan: plans.Plan) -> bool:
    return any(v.kind == plan.kind and v.kv == plan.kv and v.warps == plan.warps
               and v.stages == plan.stages and (v.kind != "cluster" or v.splits == plan.splits)
               for v in plans.variants())


def short_window(window: int, batch: int, kvh: int, sms: int) -> bool:
    # A window of at most 8 pages a warp of the short-span kernel (a
    # cluster's 16 warps at 1-2 requests, else 4), 4 where its grid has fewer
    # CTAs than a quarter of the SMs.
    ctas = (4 if batch <= 2 else 1) * batch * kvh
    per_warp = 8 if 4 * ctas >= sms else 4
    return -(-window // 16) <= per_warp * (16 if batch <= 2 else 4)


@pytest.mark.parametrize("sms", SMS)
def test_plan_rules(sms):
    split_max_pairs = max(8, 2 * sms // 8)
    for batch in BATCHES:
        for kvh in KV_HEADS:
            pairs = batch * kvh
            for window in WINDOWS:
                got = {kv: plans.plan_for_shape(batch, kvh, window, kv, sms) for kv in plans.KV_DTYPES}
                shape = (batch, kvh, window, sms)
                for kv, plan in got.items():
                    assert plan.kv == kv and compiled(plan), (shape, plan)
                    # Full attention over 8+ requests and more pairs than the
                    # split grid (2 x SMs CTAs) gives 8 CTAs each: balanced.
                    balanced = window is None and batch >= 8 and pairs > split_max_pairs
                    assert (plan.kind == "balanced") == balanced, (shape, plan)
                    if balanced:
                        assert (plan.warps, plan.stages) == (8, 2 if kv == "bf16" else 4), plan
                        continue
                    assert plan.splits >= 1 or plan.kind == "warp-per-head", (shape, plan)
                    assert plan.min_pages >= 1, (shape, plan)
                    if plan.kind == "split" and plan.splits > 1:
                        # The workspace holds 8 partials an SM; a split launch
                        # takes one a CTA (ops/workspace.cpp).
                        assert pairs * plan.splits <= 2 * sms, (shape, plan)
                    if window is not None:
                        if short_window(min(window, 2**31 - 1), batch, kvh, sms):
                            assert plan.kind in ("cluster", "warp-per-head") or plan.splits == 1, \
                                (shape, plan)
                        else:
                            # Longer windows: the full-attention split rules.
                            full = plans.plan_for_shape(batch, kvh, None, kv, sms, split_rules=True)
                            assert plan == full, (shape, plan, full)
                if not balanced:
                    # The same split plan for both formats, twice the (half-size)
                    # slots for fp8.
                    bf16, fp8 = got["bf16"], got["fp8"]
                    assert fp8 == dataclasses.replace(bf16, kv="fp8", stages=2 * bf16.stages), \
                        (shape, bf16, fp8)


def test_plan_for_shape_refuses_bad_arguments():
    ops = plans._ops()
    for args in [(0, 8, 0, 0, 132), (1, 0, 0, 0, 132), (1, 8, -1, 0, 132), (1, 8, 0, 2, 132),
                 (1, 8, 0, 0, 0), (65536, 65536, 0, 0, 132)]:
        with pytest.raises(RuntimeError, match="plan_for_shape"):
            ops.plan_for_shape(*args, False)
