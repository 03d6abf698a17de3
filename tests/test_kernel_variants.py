"""Every compiled kernel variant, from the extension's own table (the rows of
csrc/decode_attention/kernels/variants.h, read through
flint_attention.testing.plans), launched with an explicit plan,
against the float64 reference and against a second run (bitwise: a moving
result is a race). The op itself launches only the default plan; the others
are there for A/B runs, and must compute right answers too.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import HOPPER_SKIP_REASON, check_output, needs_hopper, reference

from flint_attention.testing import FP8, DEFAULT_SCALE, make_paged_inputs

pytestmark = needs_hopper

if HOPPER_SKIP_REASON is None:
    from flint_attention.testing import plans

    VARIANTS = plans.variants()
else:
    VARIANTS = []


def inputs(plan, seq_lens, kvh, window, **kw):
    fp8 = dict(kv_dtype=FP8, k_scale=[0.01 * (h + 1) for h in range(kvh)], v_scale=0.02) \
        if plan.kv == "fp8" else {}
    return make_paged_inputs(len(seq_lens), seq_lens, kvh, window, "cuda", **fp8, **kw)


def run(plan, inp, window, scale=DEFAULT_SCALE):
    return plans.run_with_plan(plan, inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                               window, scale, inp.out, inp.k_scale, inp.v_scale, inp.lse)


def check_twice(plan, inp, window, scale=DEFAULT_SCALE):
    run(plan, inp, window, scale)
    torch.cuda.synchronize()
    check_output(inp.out, inp, window, scale, what=plan.name)
    first = inp.out.clone()
    inp.out.fill_(math.nan)
    run(plan, inp, window, scale)
    assert torch.equal(inp.out, first), f"{plan.name}: a second run on the same inputs differs"


CASES = [
    # seq_lens, kv heads, window
    ([0, 1, 15, 16, 17, 33, 250, 1000, 4097, 129], 2, None),
    ([0, 1, 15, 16, 17, 33, 250, 1000, 4097, 129], 2, 37),
    ([20000], 1, None),
    ([5000, 0, 3, 8192], 8, 128),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{len(c[0])}-kvh{c[1]}-w{c[2]}")
@pytest.mark.parametrize("plan", VARIANTS, ids=lambda p: p.name)
def test_variant_matches_reference(plan, case):
    seq_lens, kvh, window = case
    check_twice(plan, inputs(plan, seq_lens, kvh, window), window)


@pytest.mark.parametrize("group, sinks, window", [(1, False, None), (3, True, 37), (4, False, 37), (5, True, None), (7, False, None)])
@pytest.mark.parametrize("plan", VARIANTS, ids=lambda p: p.name)
def test_variant_groups_without_sinks_with_lse(plan, group, sinks, window):
    # Groups below 8 leave MMA columns without a query head: nothing of them
    # may be written (out and lse are NaN-filled); no sinks, and the lse.
    inp = inputs(plan, [0, 1, 17, 250, 4097, 129], 2, window, group=group, with_sinks=sinks, with_lse=True)
    check_twice(plan, inp, window)
    ref_lse = reference(inp, window, DEFAULT_SCALE, return_lse=True)[1].cpu()
    lse = inp.lse.double().cpu()
    assert torch.equal(lse.isinf(), ref_lse.isinf()) and not lse.isnan().any(), f"{plan.name}: lse {lse} vs {ref_lse}"
    finite = ref_lse.isfinite()
    assert (lse[finite] - ref_lse[finite]).abs().max() < 1e-4, f"{plan.name}: lse off"


# (group, query tokens, sinks, window): a kv head's group x tokens rows go
# through the kernels in tiles of 8, so these are 2 (the second partly
# filled), 2, 2 (partly), 2, 5 and 16 tiles, windows shorter and longer than
# the draft.
ROW_TILES = [(12, 1, True, None), (16, 1, False, 37), (4, 3, False, 2), (8, 2, True, None),
             (5, 8, True, 5), (16, 8, False, 20)]


@pytest.mark.parametrize("tiles", ROW_TILES, ids=lambda c: f"g{c[0]}-q{c[1]}-sinks{int(c[2])}-w{c[3]}")
@pytest.mark.parametrize("plan", VARIANTS, ids=lambda p: p.name)
def test_variant_row_tiles(plan, tiles):
    # Requests shorter than the draft (tokens before position 0: zeros, the
    # sink's lse), drafts straddling a page boundary, one long request.
    # One kv head for 16 tiles: a forced 4-split plan over 8 requests x 2 kv
    # heads x 16 tiles would need more merge counters than the workspace
    # holds (a clear error; the default plans stay within it).
    group, q_tokens, sinks, window = tiles
    lens = [0, 1, q_tokens - 1, 17, 250, 2057, 129, 31]
    kvh = 1 if group * q_tokens > 64 else 2
    inp = inputs(plan, lens, kvh, window, group=group, q_tokens=q_tokens, with_sinks=sinks, with_lse=True)
    check_twice(plan, inp, window)
    ref_lse = reference(inp, window, DEFAULT_SCALE, return_lse=True)[1].cpu()
    lse = inp.lse.double().cpu()
    assert torch.equal(lse.isinf(), ref_lse.isinf()) and not lse.isnan().any(), f"{plan.name}: lse {lse} vs {ref_lse}"
    finite = ref_lse.isfinite()
    assert (lse[finite] - ref_lse[finite]).abs().max() < 1e-4, f"{plan.name}: lse off"


@pytest.mark.parametrize("plan", [p for p in VARIANTS if p.kind == "balanced"], ids=lambda p: p.name)
@pytest.mark.parametrize("window", [None, 64])
def test_balanced_variant_many_requests(plan, window):
    # More segments than warps: every warp streams several pieces, its ring
    # going on from one to the next (empty requests between them).
    seq_lens = torch.randint(0, 700, (700,)).tolist()
    for i in range(0, 700, 37):
        seq_lens[i] = 0
    check_twice(plan, inputs(plan, seq_lens, 4, window), window)


@pytest.mark.parametrize("pdl", [True, False])
def test_plan_without_pdl(pdl):
    inp = make_paged_inputs(3, [3000, 0, 77], 2, None, "cuda")
    for plan in (plans.default_plan(inp.q, inp.kv_cache, None), plans.balanced_plan(inp.kv_cache)):
        check_twice(dataclasses.replace(plan, pdl=pdl), inp, None)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
def test_default_plan(kv_dtype):
    # The plan the op takes on this GPU (and the split kernels' plan) is the
    # host rule's at this GPU's SM count: tests/test_launch_plan.py checks
    # those rules over many shapes and SM counts on any machine. Never a
    # function of the block tables (not an input).
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kv = "fp8" if kv_dtype == FP8 else "bf16"
    for batch, kvh, window in [(1, 8, None), (7, 2, None), (8, 1, None), (8, 2, None),
                               (16, 2, None), (17, 2, None), (33, 1, None), (34, 1, None),
                               (8, 8, None), (512, 2, None), (1, 8, 128), (64, 1, 128),
                               (3, 16, 4096), (4, 8, 256), (4, 8, 257), (16, 8, 512),
                               (16, 8, 513), (1, 8, 1024), (1, 8, 1025), (2, 8, 2048),
                               (2, 8, 2049), (8, 2, 4096), (64, 8, 4096), (512, 8, 128),
                               (512, 8, 1024), (16, 2, 200_000), (3, 1, 128)]:
        q = torch.empty(batch, 8 * kvh, 128, dtype=torch.bfloat16, device="cuda")
        cache = torch.empty(1, kvh, 16, 256, dtype=kv_dtype, device="cuda")
        plan = plans.default_plan(q, cache, window)
        host = plans.plan_for_shape(batch, kvh, window, kv, sms)
        assert plan == dataclasses.replace(host, pdl=plan.pdl), (batch, kvh, window, plan, host)
        split = plans.split_rules_plan(q, cache, window)
        host = plans.plan_for_shape(batch, kvh, window, kv, sms, split_rules=True)
        assert split == dataclasses.replace(host, pdl=split.pdl), (batch, kvh, window, split)


def test_unsupported_plan_is_an_error():
    inp = make_paged_inputs(1, [5], 1, None, "cuda")
    bad = plans.Plan(kind="balanced", warps=6)
    with pytest.raises(RuntimeError, match="no compiled kernel for balanced bf16, warps 6"):
        run(bad, inp, None)
    with pytest.raises(RuntimeError, match="the launch plan is for an fp8 cache"):
        run(plans.Plan(kv="fp8", stages=4), inp, None)
    with pytest.raises(RuntimeError, match="no compiled kernel for split fp8, warps 8, stages 2"):
        run(plans.Plan(kind="split", kv="fp8", warps=8, stages=2, splits=4),
            make_paged_inputs(1, [5], 1, None, "cuda", kv_dtype=FP8, k_scale=1.0, v_scale=1.0), None)
    with pytest.raises(RuntimeError, match="a split plan needs splits >= 1"):
        run(plans.Plan(kind="split", warps=8, stages=2, splits=0), inp, None)


@pytest.mark.parametrize("window", [None, 128])
def test_back_to_back_calls(window):
    # Each call lets its PDL successor launch once past griddepcontrol.wait;
    # four calls on four input sets queued without a sync (a successor's
    # prologue overlaps the call before it, which still uses the shared
    # workspace) must each give the right answer.
    sets = []
    for i in range(4):
        seq_lens = torch.randint(0, 5000, (24,)).tolist()
        seq_lens[i] = 0
        sets.append(make_paged_inputs(24, seq_lens, 2, window, "cuda"))
    from flint_attention import flint_decode_attention

    for inp in sets:
        flint_decode_attention(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                               window, DEFAULT_SCALE, inp.out)
    torch.cuda.synchronize()
    for inp in sets:
        check_output(inp.out, inp, window)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("batch,kvh", [(8, 1), (4, 2), (3, 4), (6, 2), (16, 1)])
def test_split_ctas_follow_the_lengths(kv_dtype, batch, kvh):
    # The split kernels divide each kv head's CTAs among the requests from the
    # actual lengths (kernel_split.cuh, cta_share): one capture of the split plan,
    # replayed with lengths that move the division (one long request among
    # padding rows, equal lengths, one token, nothing to attend, random), each
    # replay against float64 with stale slots poisoned. The plan's own rules
    # pick 9-warp splits for (8, 1) and (4, 2), 8-warp ones for (3, 4), 4-warp
    # ones for (6, 2); (16, 1) is the split plan beyond where the op uses it.
    sets = [
        [0] * (batch - 1) + [70000],
        [3000] * batch,
        [1] + [0] * (batch - 1),
        [0] * batch,
        [40000, 0, 17] + [0] * (batch - 3),
        torch.randint(0, 30000, (batch,)).tolist(),
    ]
    fp8 = dict(kv_dtype=FP8, k_scale=[0.01 * (h + 1) for h in range(kvh)], v_scale=0.02) \
        if kv_dtype == FP8 else {}
    made = [make_paged_inputs(batch, lens, kvh, None, "cuda", num_blocks=batch * 4400 + 64,
                              max_blocks=4400, **fp8) for lens in sets]
    live = made[0]
    plan = plans.split_rules_plan(live.q, live.kv_cache, None)
    assert plan.kind == "split", plan
    run(plan, live, None)
    torch.cuda.synchronize()
    check_output(live.out, live, None, what=f"{plan.name} eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(plan, live, None)
    for step, new in enumerate(made[1:] + made[:1]):
        for name in ("q", "kv_cache", "block_tables", "seq_lens", "sinks", "k_scale", "v_scale"):
            if getattr(live, name) is not None:
                getattr(live, name).copy_(getattr(new, name))
        live.out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_output(live.out, new, None, what=f"{plan.name} replay {step} {sets[(step + 1) % len(sets)][:4]}")


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
def test_split_merge_fan_in(kv_dtype):
    # One request over one kv head: the 9-warp split plan gives it f = pages / 9
    # splits (up to the 132 of one wave; 64k tokens: 114), so 144 f tokens
    # give exactly f. Past a fan-in of 48 the splits merge in two levels
    # (kernel_split.cuh: groups of ceil(sqrt(f)), the last group short where f is
    # no square multiple); the lengths straddle both thresholds and the
    # uneven groups, and each one runs twice (bitwise: a moving result is a race).
    fan_ins = [16, 17, 47, 48, 49, 50, 64, 65, 113, 121, 132]
    for seq_len in [144 * f for f in fan_ins] + [144 * 50 - 5, 65536]:
        fp8 = dict(kv_dtype=FP8, k_scale=0.03, v_scale=[0.5]) if kv_dtype == FP8 else {}
        inp = make_paged_inputs(1, [seq_len], 1, None, "cuda", **fp8)
        plan = plans.split_rules_plan(inp.q, inp.kv_cache, None)
        assert plan.kind == "split" and plan.warps == 9, plan
        check_twice(plan, inp, None)


def test_split_plan_of_one_split_uses_no_workspace():
    # 600 requests x 8 kv heads: the split plan gives each pair one CTA, which
    # writes its output itself, so the launch needs no partials or counters
    # (it once asked for 8 counters a pair, more than the workspace holds).
    inp = make_paged_inputs(600, torch.randint(0, 70, (600,)).tolist(), 8, None, "cuda")
    plan = plans.split_rules_plan(inp.q, inp.kv_cache, None)
    assert plan.kind == "split" and plan.splits == 1, plan
    check_twice(plan, inp, None)


def _attended_pages(seq_lens, window):
    """Pages of [start, len) per request, counted here from the spec."""
    out = []
    for n in seq_lens:
        start = max(n - window, 0) if window else 0
        out.append(-(-n // 16) - start // 16 if n > 0 else 0)
    return out


@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("kind", ["split", "cluster", "warp-per-head"])
def test_cta_pages_cover_every_page_once(kind, window):
    # The benchmark's balance column for the non-balanced kernels
    # (plans.Plan.cta_pages): the division redone on the host must hand out
    # each attended page of each (request, kv head) exactly once, over the
    # launch's grid, whatever the lengths (fresh ragged ones, padding rows).
    plan = next(p for p in VARIANTS if p.kind == kind and p.kv == "bf16")
    if kind == "split":
        plan = dataclasses.replace(plan, splits=int(torch.randint(1, 20, ()).item()))
    kvh = int(torch.randint(1, 9, ()).item())
    batch = int(torch.randint(1, 200, ()).item())
    seq_lens = torch.randint(0, 9000, (batch,))
    seq_lens[torch.rand(batch) < 0.2] = 0
    seq_lens = seq_lens.tolist()
    inp = make_paged_inputs(batch, seq_lens, kvh, window, "cuda")
    per_cta = plan.cta_pages(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, window)
    if kind != "warp-per-head":  # grid (splits, kv heads, batch)
        assert len(per_cta) == batch * kvh * plan.splits, (plan.name, len(per_cta))
    assert min(per_cta) >= 0
    assert sum(per_cta) == kvh * sum(_attended_pages(seq_lens, window)), (plan.name, seq_lens)
    busiest, mean = plan.balance(seq_lens, window, kvh, max_blocks=inp.block_tables.shape[1])
    assert busiest == max(per_cta) and mean == pytest.approx(sum(per_cta) / len(per_cta))


def test_cta_pages_of_one_long_request():
    # Worked by hand from kernel_split.cuh: 512 pages of one request over 16 CTAs of
    # 9 warps. 15 splits of 9 warps give each warp at most 4 pages (16 of the 8
    # merge warps would too, but need more splits), page k to warp k mod 135:
    # warps 0..106 take 4, 107..134 take 3, so CTAs 0..10 stream 36 pages,
    # CTA 11 35, CTAs 12..14 27 and CTA 15 none, for each kv head.
    plan = plans.Plan(kind="split", warps=9, stages=2, splits=16, min_pages=1)
    inp = make_paged_inputs(1, [8192], 2, None, "cuda")
    per_cta = plan.cta_pages(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, None)
    assert per_cta == ([36] * 11 + [35] + [27] * 3 + [0]) * 2


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("seq_lens,kvh", [([65536], 1), ([20000, 0, 3000], 2)],
                         ids=["two-level-merge", "b3-kvh2"])
def test_split_phase_stamps_build_changes_no_bit(kv_dtype, seq_lens, kvh):
    # The testing extension's stamped build of the 9-warp split kernel
    # (tools/phases_row.py --kernel split) computes what the op's build
    # computes, bit for bit, and stamps each warp's phases (SplitPhase,
    # kernel_split.cuh) in order. [65536] over one kv head: 114 splits, merged in
    # two levels; [20000, 0, 3000] over 2: the CTAs divided by the lengths,
    # one request with nothing to attend.
    fp8 = dict(kv_dtype=FP8, k_scale=0.03, v_scale=[0.5] * kvh) if kv_dtype == FP8 else {}
    inp = make_paged_inputs(len(seq_lens), seq_lens, kvh, None, "cuda", **fp8)
    plan = plans.split_rules_plan(inp.q, inp.kv_cache, None)
    assert plan.kind == "split" and plan.warps == 9, plan
    run(plan, inp, None)
    torch.cuda.synchronize()
    check_output(inp.out, inp, None, what=plan.name)
    ref = inp.out.clone()
    ctas = plan.splits * kvh * len(seq_lens)
    stamps = torch.zeros(ctas, 9, 8, dtype=torch.int64, device="cuda")
    inp.out.fill_(math.nan)
    plans._ops().split_phases(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                              None, DEFAULT_SCALE, inp.out, inp.k_scale, inp.v_scale, stamps,
                              plan.to_ints())
    torch.cuda.synchronize()
    assert torch.equal(inp.out.view(torch.int16), ref.view(torch.int16))
    s = stamps.cpu()
    # Every phase is reached by some warp, and each warp reaches its phases
    # in order: its stamps are a prefix of the eight, non-decreasing (a warp
    # that streams nothing still passes the wait; only the merges are skipped
    # by warps that do not merge last).
    for k in range(8):
        assert bool((s[..., k] > 0).any()), f"no warp reached phase {k}"
    reached = s > 0
    streamed = reached[..., 4]
    assert bool((reached[..., :5][streamed]).all()), "a warp streamed without the earlier phases"
    for k in range(1, 5):
        both = reached[..., k] & reached[..., k - 1]
        assert bool((s[..., k][both] >= s[..., k - 1][both]).all()), f"phase {k} before {k - 1}"
    # The final merge of each kv head's 8 heads x dims: one merge warp slot
    # each (the warp of that index in the last CTA to arrive) for each
    # (request, kv head) with pages.
    pairs = kvh * sum(1 for n in seq_lens if n > 0)
    assert int(reached[..., 7].sum()) == 8 * pairs
