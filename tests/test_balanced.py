"""The balanced kernel (what the op launches for full attention from 8
requests and over more than 8 (request, kv head) pairs; here launched on every shape through its plan,
flint_attention.testing.plans): the batch's attended pages
divided equally among the warps of a one-wave grid on the device, segments
split over warps merged in shared memory, over CTAs through workspace
partials (in two levels past a fan-in of 48).

Shapes built to hit that machinery on purpose: lengths whose segments end on
and next to the warps' and CTAs' share boundaries (read from the division the
kernel computes, through the testing extension), fan-ins on both sides of the
two-level threshold, one long request among many short ones, padding rows,
CUDA-graph replays whose lengths move every segment to other CTAs. Every
output against float64 and the CPU path (conftest.check_output), bf16 and fp8.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import HOPPER_SKIP_REASON, check_output, needs_hopper

from flint_attention.testing import FP8, DEFAULT_SCALE, make_paged_inputs

pytestmark = needs_hopper
KV_DTYPES = [torch.bfloat16, FP8]

if HOPPER_SKIP_REASON is None:
    from flint_attention.testing import plans


def make(seq_lens, kvh, window=None, kv_dtype=torch.bfloat16, **kw):
    fp8 = dict(k_scale=[0.01 + 0.003 * h for h in range(kvh)], v_scale=0.015) if kv_dtype == FP8 else {}
    return make_paged_inputs(len(seq_lens), seq_lens, kvh, window, "cuda", kv_dtype=kv_dtype, **fp8, **kw)


def run_op(inp, window):
    """The balanced kernel on `inp` (writes and returns inp.out)."""
    return plans.run_with_plan(plans.balanced_plan(inp.kv_cache), inp.q, inp.kv_cache,
                               inp.block_tables, inp.seq_lens, inp.sinks, window, DEFAULT_SCALE,
                               inp.out, inp.k_scale, inp.v_scale)


def division(inp, window):
    """(CTAs, units of the busiest CTA, total units, units per warp, units per
    CTA, a segment's units besides its pages) of the balanced kernel's launch
    (csrc/decode_attention/division.h: a segment is `cost` units, then one
    unit per page)."""
    return plans._ops().division(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, window,
                                 plans.balanced_plan(inp.kv_cache).to_ints())


def grid_and_warps(kv_dtype=torch.bfloat16):
    """(CTAs, warps per CTA, the fewest units a warp's share has, a segment's
    units besides its pages)."""
    inp = make([1], 1, kv_dtype=kv_dtype)
    plan = plans.balanced_plan(inp.kv_cache)
    ctas, _, _, per_warp, _, cost = division(inp, None)
    return ctas, plan.warps, per_warp, cost


def tokens(pages: int, short: int) -> int:
    """A length of `pages` pages whose last page holds 16 - short tokens."""
    return max(16 * pages - short, 0)


def check_bitwise_repeat(inp, window, runs=3):
    first = inp.out.clone()
    for run in range(runs):
        inp.out.fill_(math.nan)
        assert torch.equal(run_op(inp, window), first), f"run {run + 1} differs from the first"


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_one_long_request_among_255_short(kv_dtype):
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(1, 2000, (256,), generator=g).tolist()
    lens[77] = 131072
    inp = make(lens, 2, kv_dtype=kv_dtype)
    check_output(run_op(inp, None), inp, None)
    check_bitwise_repeat(inp, None)


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("kvh", [1, 8])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_runs_of_segments_shorter_than_the_ring(kv_dtype, kvh, window):
    # Runs of requests of 1-3 pages (fewer than a ring's slots: each of their
    # segments is a piece whose successor's pages must already be in flight)
    # between longer ones and padding rows, so that warps stream many such
    # pieces in a row, across share boundaries too.
    g = torch.Generator().manual_seed(7)
    lens = []
    for _ in range(40):
        n = int(torch.randint(1, 9, (1,), generator=g))
        lens += torch.randint(1, 49, (n,), generator=g).tolist()
        lens += [int(torch.randint(49, 3000, (1,), generator=g)), 0, 16, 32, 48]
    inp = make(lens, kvh, window, kv_dtype)
    check_output(run_op(inp, window), inp, window)
    check_bitwise_repeat(inp, window)


@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_all_requests_empty(kv_dtype, window):
    inp = make([0] * 48, 2, window, kv_dtype)
    out = run_op(inp, window)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_one_nonzero_request_in_512(kv_dtype):
    lens = [0] * 512
    lens[300] = 5000
    inp = make(lens, 1, kv_dtype=kv_dtype)
    check_output(run_op(inp, None), inp, None)


@pytest.mark.parametrize("kvh", [1, 3])
@pytest.mark.parametrize("extra", [0, 2])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_segments_end_on_and_next_to_share_boundaries(kv_dtype, extra, kvh):
    # Request unit counts (a segment is `cost` units, then its pages) chosen
    # so that segment ends fall exactly on, one before and one after warp and
    # CTA boundaries; the last request fills the batch up to the total that
    # gives each warp per_warp units.
    ctas, warps, fewest, cost = grid_and_warps(kv_dtype)
    per_warp = fewest + extra
    cta = per_warp * warps
    budget = ctas * warps * per_warp // kvh  # units of all requests, per kv head
    pattern = [cta, cta - 1, cost + 1, per_warp, per_warp + 1, per_warp - 1, 2 * cta + 1,
               cta - 2, cost + 1, cost + 1, 3 * per_warp, cta + per_warp]
    units = []
    for n in pattern:
        if sum(units) + n < budget - cost:
            units.append(n)
    units.append(budget - sum(units))
    lens = [tokens(u - cost, short=i % 16) for i, u in enumerate(units)]
    lens.insert(3, 0)  # a padding row in between
    inp = make(lens, kvh, kv_dtype=kv_dtype)
    got_ctas, busiest, got_total, got_per_warp, _, _ = division(inp, None)
    assert (got_ctas, got_total, got_per_warp) == (ctas, kvh * budget, per_warp)
    check_output(run_op(inp, None), inp, None)
    check_bitwise_repeat(inp, None)


@pytest.mark.parametrize("fan_in", [2, 23, 24, 25, 47, 48, 49, 132])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_merge_fan_in_around_the_two_level_threshold(kv_dtype, fan_in):
    # One request, one kv head, fewer pages than the grid's warps take at
    # their fewest: each CTA takes cta_pages of them, so the segment spans
    # ceil(pages / cta_pages) CTAs (merged in one level up to 24 partials per
    # thread chunk of 8 x 3 with 4-warp CTAs, 48 with 8-warp ones; past
    # that in two).
    ctas, warps, fewest, cost = grid_and_warps(kv_dtype)
    if fan_in > ctas:
        pytest.skip(f"only {ctas} CTAs")
    cta = warps * fewest
    pages = fan_in * cta - cost if fan_in == ctas else (fan_in - 1) * cta + 1
    inp = make([tokens(pages, 5)], 1, kv_dtype=kv_dtype)
    _, _, total, per_warp, cta_pages, _ = division(inp, None)
    # the segment's pages are units cost .. total - 1
    assert total == pages + cost and per_warp == fewest
    assert (total - 1) // cta_pages - cost // cta_pages + 1 == fan_in
    check_output(run_op(inp, None), inp, None)
    check_bitwise_repeat(inp, None)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_tp_shard_one_request_one_kv_head(kv_dtype):
    inp = make([65536], 1, kv_dtype=kv_dtype)
    check_output(run_op(inp, None), inp, None)
    check_bitwise_repeat(inp, None)


@pytest.mark.parametrize("window", [1, 128, 4096])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_windows_with_ragged_lengths(kv_dtype, window):
    g = torch.Generator().manual_seed(window)
    lens = torch.randint(0, 9000, (64,), generator=g).tolist()
    lens[5:9] = [window - 1, window, window + 1, window + 16]
    lens[-14:] = [0] * 14  # padding to a capture size
    inp = make(lens, 2, window, kv_dtype)
    check_output(run_op(inp, window), inp, window)


@pytest.mark.parametrize("kvh", [1, 3, 16])
@pytest.mark.parametrize("window", [None, 128])
def test_kv_heads(kvh, window):
    g = torch.Generator().manual_seed(kvh)
    lens = torch.randint(0, 6000, (24,), generator=g).tolist()
    lens[0], lens[-1] = 0, 20000
    inp = make(lens, kvh, window)
    check_output(run_op(inp, window), inp, window)


@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_cuda_graph_replays_move_the_balance(kv_dtype, window):
    # One capture, replayed with lengths that change the division (pages per
    # warp) and so which CTAs cover which segment, and which segments are
    # split and merged through the workspace.
    batch, kvh = 16, 2
    sets = [
        [8192] + [0] * 15,                       # one segment over every CTA
        [16] * 16,                               # one page each
        [30000, 5, 0, 900] * 4,                  # a few long ones
        [0] * 16,                                # nothing to attend
        torch.randint(0, 12000, (batch,)).tolist(),
    ]
    inputs = [make(lens, kvh, window, kv_dtype, num_blocks=16 * 1900, max_blocks=1900) for lens in sets]
    live = inputs[0]
    check_output(run_op(live, window), live, window, what="eager warm-up")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_op(live, window)  # the balanced kernel: its division moves between replays
    divisions = set()
    for step, new in enumerate(inputs[1:] + inputs[:1]):
        for name in ("q", "kv_cache", "block_tables", "seq_lens", "sinks", "k_scale", "v_scale"):
            if getattr(live, name) is not None:
                getattr(live, name).copy_(getattr(new, name))
        divisions.add(tuple(division(live, window)))
        live.out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_output(live.out, new, window, what=f"replay {step}")
    assert len(divisions) >= 4, f"the replays should move the division: {divisions}"


def test_thousand_launches_with_two_level_merges():
    # Counters reset themselves: alternating a two-level merge (one long
    # segment over every CTA), a one-level one and short segments over 1000
    # launches, every output equals the first of its inputs bit for bit.
    configs = [make([65536], 1), make([5000, 17, 8192, 1], 8), make([300] * 100, 1)]
    outs = []
    for i in range(1000):
        inp = configs[i % 3]
        out = torch.full_like(inp.out, math.nan)
        plans.run_with_plan(plans.balanced_plan(inp.kv_cache), inp.q, inp.kv_cache,
                            inp.block_tables, inp.seq_lens, inp.sinks, None, DEFAULT_SCALE, out)
        outs.append(out)
    torch.cuda.synchronize()
    for i in [0, 1, 2, 3, 4, 5, 997, 998, 999]:
        check_output(outs[i], configs[i % 3], None, what=f"launch {i}")
    changed = [i for i, out in enumerate(outs) if not torch.equal(out, outs[i % 3])]
    assert not changed, f"{len(changed)} launches differ from the first of their inputs, first {changed[0]}"


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=["bf16", "fp8"])
def test_phase_stamps_build_changes_no_bit(kv_dtype):
    # The testing extension's stamped build of the balanced kernel
    # (tools/phases_row.py) computes what the op's build computes, bit
    # for bit, and stamps every warp's phases in order (with a two-level
    # merge: one request over the whole grid).
    inp = make([131072, 300, 0, 5000], 2, kv_dtype=kv_dtype)
    window = None
    ref = run_op(inp, window).clone()
    ctas, _, total, per_warp, _, _ = division(inp, window)
    stamps = torch.zeros(ctas, 8, 9 + 9 + 1, dtype=torch.int64, device="cuda")
    inp.out.fill_(float("nan"))
    plans._ops().balanced_phases(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                                 window, DEFAULT_SCALE, inp.out, inp.k_scale, inp.v_scale, stamps)
    assert torch.equal(inp.out.view(torch.int16), ref.view(torch.int16))
    s = stamps.cpu()
    # Every warp reaches the first six phases (entered .. cta_ready), in order.
    assert bool((s[..., :6] > 0).all())
    assert bool((s[..., 1:6] >= s[..., :5]).all())
    # Some CTAs merge across CTAs, and some finish a segment.
    assert bool((s[..., 7] > 0).any()) and bool((s[..., 8] > 0).any())
    # A warp with pages in its share streams at least one piece, and the
    # first page's wait and page math take cycles; one without streams none.
    busy = (torch.arange(ctas * 8) * per_warp < total).view(ctas, 8)
    assert torch.equal(s[..., 18] >= 1, busy)
    assert bool((s[..., 9 + 1][busy] > 0).all()) and bool((s[..., 9 + 7][busy] > 0).all())
