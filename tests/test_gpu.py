"""GPU-only behaviour of the CUDA kernel: the large grid, CUDA graphs, streams,
counter reuse over many launches, capture before the first call, determinism.

Every output is checked against the float64 reference and against the CPU path
(conftest.check_output). Tests marked ``sanitizer_subset`` are a small
representative set for compute-sanitizer: ``pytest -m sanitizer_subset tests``.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import (
    LAYOUTS,
    assert_close,
    check_against_reference,
    check_output,
    layout_grid,
    needs_hopper,
    reference,
    run_op,
)

from flint_attention import flint_decode_attention
from flint_attention.testing import BF16_VS_F64, DEFAULT_SCALE, FP8, make_paged_inputs

pytestmark = needs_hopper
sanitizer_subset = pytest.mark.sanitizer_subset
NAN = math.nan

BATCHES = [1, 2, 3, 4, 5, 16, 17, 64, 133, 256, 1024]
KV_HEADS = [1, 2, 4, 8, 16]
WINDOWS = [None, 1, 128, 4096, 200_000]  # the last is beyond every seq_len
EDGES = [0, 1, 15, 16, 17, 31, 32, 33, 127, 128, 129, 1000, 4095, 4096, 4097]


def gpu_seq_lens(batch: int) -> list[int]:
    """Request 0 is 131072 long and, for batch >= 3, the last one 65537; the
    others take the page-boundary lengths in EDGES in turn, from request 1's 0."""
    lens = [EDGES[(i - 1) % len(EDGES)] for i in range(batch)]
    lens[0] = 131072
    if batch >= 3:
        lens[-1] = 65537
    return lens


@pytest.mark.parametrize("batch, num_kv_heads, window, layout", list(layout_grid(BATCHES, KV_HEADS, WINDOWS)))
def test_gpu_grid(batch, num_kv_heads, window, layout):
    lens = gpu_seq_lens(batch)
    inp = make_paged_inputs(batch, lens, num_kv_heads, window, "cuda", **LAYOUTS[layout])
    check_against_reference(inp, window)


# Small configurations covering each launch path, cheap enough for a sanitizer.
REPRESENTATIVE = [
    # batch, seq_lens, kv heads, window
    (1, [4097], 8, None),  # one request: many splits, last-CTA merge
    (4, [0, 1000, 17, 2048], 8, None),  # a few requests: splits, last-CTA merge
    (133, [EDGES[i % len(EDGES)] for i in range(133)], 1, None),  # one split each
    (2, [300, 16], 8, 128),  # sliding window: cluster merge
    (17, [EDGES[i % len(EDGES)] for i in range(17)], 2, 128),  # sliding, no cluster
]


@sanitizer_subset
@pytest.mark.parametrize("batch, lens, num_kv_heads, window", REPRESENTATIVE)
def test_gpu_representative(batch, lens, num_kv_heads, window):
    inp = make_paged_inputs(batch, lens, num_kv_heads, window, "cuda", shared_pages=True, strided_cache=True)
    check_against_reference(inp, window)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_warp_per_head_pairs_past_one_wave(kv_dtype):
    # More (request, kv head) pairs than the warp-per-head kernel's resident
    # warps (~1056 on an H200): each warp streams several pairs in a row,
    # carrying the next pair's leading pages and block ids across, through
    # empty and one-page pairs between them.
    batch, kvh, window = 1200, 2, 128
    lens = [0 if i % 5 == 0 else 1 + (37 * i) % 700 for i in range(batch)]
    fp8 = dict(kv_dtype=FP8, k_scale=[0.011, 0.017], v_scale=[0.013, 0.009]) if kv_dtype == "fp8" else {}
    inp = make_paged_inputs(batch, lens, kvh, window, "cuda", **fp8)
    check_against_reference(inp, window)


@pytest.mark.parametrize("seq_len", [1, 15, 16, 17, 31, 32, 33, 1000, 4097, 32768])
@pytest.mark.parametrize("num_kv_heads", [1, 8])
@pytest.mark.parametrize("window", [None, 128])
def test_gpu_single_request(seq_len, num_kv_heads, window):
    inp = make_paged_inputs(1, [seq_len], num_kv_heads, window, "cuda")
    check_against_reference(inp, window)


@sanitizer_subset
@pytest.mark.parametrize("shape", [dict(), dict(group=12, q_tokens=3)], ids=["g8", "g12_q3"])
@pytest.mark.parametrize("window", [None, 128])
def test_cuda_graph_replays_follow_inputs_changed_in_place(window, shape):
    # Lengths grow, shrink and hit 0 between replays; block tables, q, sinks
    # and the cache contents all change. Shapes stay fixed, as a graph needs.
    # With query tokens, the drafts move across page boundaries (lengths 15,
    # 17, 18, 33) and some requests are shorter than the draft.
    batch, num_kv_heads = 4, 8
    sets = [[1, 4097, 0, 300], [2000, 17, 16, 5000], [33, 0, 6000, 1], [15, 18, 2, 31], [0, 0, 0, 0]]
    inputs = [
        make_paged_inputs(batch, lens, num_kv_heads, window, "cuda", strided_cache=True,
                          num_blocks=1200, max_blocks=400, **shape)
        for lens in sets
    ]  # fmt: skip
    live = inputs[0]
    check_against_reference(live, window, what="eager warm-up")  # required before capture

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_op(live, window)
    for step, new in enumerate(inputs[1:] + inputs[:2]):
        for name in ("q", "kv_cache", "block_tables", "seq_lens", "sinks"):
            getattr(live, name).copy_(getattr(new, name))
        live.out.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        check_output(live.out, new, window, what=f"replay {step}")


@sanitizer_subset
def test_two_streams():
    # Calls alternate between two streams; the op shares its workspace across
    # them and must order itself.
    configs = [(1, [32768], None), (4, [5000, 17, 8192, 1], None), (3, [700, 0, 9000], 128)]
    inputs = [
        (make_paged_inputs(b, lens, 8, window, "cuda"), window)
        for b, lens, window in configs * 2
    ]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()  # inputs were written on the default stream
    for i, (inp, window) in enumerate(inputs):
        with torch.cuda.stream(streams[i % 2]):
            run_op(inp, window)
    torch.cuda.synchronize()
    for i, (inp, window) in enumerate(inputs):
        check_output(inp.out, inp, window, what=f"call {i} on stream {i % 2}")


@sanitizer_subset
def test_default_stream_then_side_stream():
    # The legacy default stream is handle 0 and PyTorch's side streams do not
    # synchronize with it: a call there followed by one on a side stream (and
    # back) must still be ordered by the op, or the two share the arrival
    # counters while both run. Long multi-split calls first, many rounds.
    big = [make_paged_inputs(1, [32768], 8, None, "cuda") for _ in range(2)]
    small = [make_paged_inputs(4, [5000, 17, 8192, 1], 8, None, "cuda") for _ in range(2)]
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    default = torch.cuda.default_stream()
    outs = []
    for round_ in range(8):
        first, second = (default, side) if round_ % 2 == 0 else (side, default)
        for stream, inp in ((first, big[round_ % 2]), (second, small[round_ % 2])):
            with torch.cuda.stream(stream):
                out = torch.full_like(inp.out, NAN)
                flint_decode_attention(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens,
                                       inp.sinks, None, 0.125, out)
                outs.append((out, inp))
    torch.cuda.synchronize()
    for i, (out, inp) in enumerate(outs[:4]):
        check_output(out, inp, None, 0.125, what=f"call {i}")
    for i, (out, inp) in enumerate(outs):
        first_of_its_inputs = next(o for o, x in outs if x is inp)
        assert torch.equal(out, first_of_its_inputs), f"call {i} differs from the first on its inputs"


def test_thousand_launches_reuse_counters():
    # Configs that split a (request, kv head) over CTAs, merged through the
    # self-resetting arrival counters; alternating them reuses the counters
    # with different split counts. Every output must equal the first one of its
    # config bit for bit, and samples are checked against the references.
    # The third config has 4 query tokens over 12 query heads a kv head: 6
    # row tiles a kv head, each split over CTAs.
    configs = [make_paged_inputs(1, [32768], 8, None, "cuda"), make_paged_inputs(4, [5000, 17, 8192, 1], 8, None, "cuda"),
               make_paged_inputs(2, [20000, 3], 2, None, "cuda", group=12, q_tokens=4)]
    outs = []
    for i in range(1000):
        inp = configs[i % 3]
        out = torch.full_like(inp.out, NAN)
        flint_decode_attention(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, None, 0.125, out)
        outs.append(out)
    torch.cuda.synchronize()
    for i in [0, 1, 2, 3, 4, 5, 500, 501, 502, 996, 997, 998]:
        check_output(outs[i], configs[i % 3], None, 0.125, what=f"launch {i}")
    changed = [i for i, out in enumerate(outs) if not torch.equal(out, outs[i % 3])]
    assert not changed, f"{len(changed)} launches differ from the first of their config, first {changed[0]}"


def test_first_call_inside_graph_capture_raises_clearly():
    # The first call allocates the workspace, which capture cannot do: a first
    # call inside capture must raise a clear error, not crash or hang. Needs a
    # process where the op has never run.
    script = textwrap.dedent(
        """
        import sys, torch
        from flint_attention import flint_decode_attention
        from flint_attention.testing import make_paged_inputs

        inp = make_paged_inputs(2, [17, 300], 8, None, "cuda")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                flint_decode_attention(*inp[:5], None, 0.125, inp.out)
        except Exception as error:  # capture teardown may raise on top of ours
            while error is not None:
                print(f"{type(error).__name__}: {error}")
                error = error.__cause__ or error.__context__
            sys.exit(0)
        print("no error raised")
        sys.exit(1)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stdout.splitlines()
    assert any(
        line.startswith("RuntimeError") and "flint" in line.lower() and "captur" in line.lower()
        and ("eager" in line.lower() or "before" in line.lower())
        for line in lines
    ), f"expected a RuntimeError naming flint and saying to run eagerly before capture, got:\n{result.stdout}"


@sanitizer_subset
@pytest.mark.parametrize(
    "batch, lens, window",
    [(1, [65536], None), (4, [5000, 0, 333, 8192], None), (2, [4097, 9000], 128), (64, [2000] * 64, 4096)],
)
def test_repeated_runs_are_bitwise_identical(batch, lens, window):
    # Split merges and cluster reductions must not depend on timing: an output
    # that moves between identical runs is a race.
    inp = make_paged_inputs(batch, lens, 8, window, "cuda")
    first = check_against_reference(inp, window).clone()
    for run in range(20):
        inp.out.fill_(NAN)
        assert torch.equal(run_op(inp, window), first), f"run {run + 1} differs from run 0"


@sanitizer_subset
@pytest.mark.parametrize("window", [None, 64])
def test_out_of_contract_values_stay_in_bounds(window):
    # The GPU does not check the data contract (that needs a sync): seq_lens
    # outside [0, 16 x max_blocks] and block ids outside [0, num_blocks) in
    # attended pages must still never read or write out of bounds (the kernel
    # clamps them; memcheck in the sanitizer subset). Their requests' outputs
    # are unspecified; every other request must be exact.
    lens = [300, 5000, 40, 17, 4097]
    inp = make_paged_inputs(5, lens, 2, window, "cuda")
    good = [0, 2, 4]
    expected = reference(inp, window)
    max_len = 16 * inp.block_tables.shape[1]
    seq_lens = inp.seq_lens.clone()
    seq_lens[1] = 10**9 if max_len < 10**9 else max_len + 1  # past the block table
    seq_lens[3] = -5
    table = inp.block_tables.clone()
    table[1, -1] = 2**31 - 1
    table[1, -2] = -1
    table[3, 0] = -(2**31)
    out = torch.full_like(inp.out, NAN)
    flint_decode_attention(inp.q, inp.kv_cache, table, seq_lens, inp.sinks, window, DEFAULT_SCALE, out)
    torch.cuda.synchronize()
    assert torch.equal(out[3], torch.zeros_like(out[3])), "a negative seq_len attends to nothing"
    assert_close(out[good], expected[good], BF16_VS_F64, "requests within the contract")
