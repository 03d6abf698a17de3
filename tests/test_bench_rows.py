"""The decode benchmark without a GPU: its rows (shapes, lengths, twins,
selection), floors and goals, the reporting (tables, fp8/bf16 ratios, the plot
of a saved run), the worker on the CPU path with a fake timer (peers missing,
plans stubbed), the supervisor's bookkeeping after a lost worker, the peers'
argument mapping and the looser peer bounds."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from benchmarks import bench_decode as bench
from benchmarks import bench_gpu as G
from benchmarks import bench_grid as grid
from benchmarks import bench_report as report
from benchmarks.peers import peer_vllm, peer_xqa
from flint_attention import flint_decode_attention
from flint_attention.testing import attended_kv_bytes, error_report, make_paged_inputs, reference_decode_attention

BENCH = bench.HERE  # benchmarks/

# The measured run behind the README's plot and benchmarks/RESULTS.md.
REFERENCE_RUN = BENCH / "reference" / "h200.json"


@pytest.fixture(autouse=True)
def _no_progress_file_left(tmp_path):
    yield
    bench.progress_path(tmp_path / "run.json").unlink(missing_ok=True)

LEGACY = [("b1_l1k", 1, 8, 1024, None), ("b1_l8k", 1, 8, 8192, None), ("b1_l32k", 1, 8, 32768, None),
          ("b1_l128k", 1, 8, 131072, None), ("b4_l8k", 4, 8, 8192, None), ("b16_l8k", 16, 8, 8192, None),
          ("b64_l8k", 64, 8, 8192, None), ("b256_l2k", 256, 8, 2048, None), ("b64_l32k", 64, 8, 32768, None),
          ("h1_b8_l8k", 8, 1, 8192, None), ("h1_b128_l4k", 128, 1, 4096, None),
          ("swa128_b1_l8k", 1, 8, 8192, 128), ("swa128_b16_l8k", 16, 8, 8192, 128),
          ("swa128_b64_l8k", 64, 8, 8192, 128), ("swa128_b256_l8k", 256, 8, 8192, 128)]


# --- rows ---------------------------------------------------------------------------------


def test_legacy_rows_unchanged():
    rows = grid.legacy_rows()
    assert [(r.name, r.batch, r.kv_heads, r.seq_len, r.window) for r in rows] == LEGACY
    for r in rows:
        assert r.placement == "compact" and r.width == -(-r.seq_len // 16) and r.lengths is None
    b1 = rows[1]
    assert b1.kv_bytes == 8192 * 8 * 512 and b1.as_dtype("fp8").kv_bytes == b1.kv_bytes // 2
    assert b1.goal_us() == pytest.approx(b1.kv_bytes / 4.5e6 / 0.93 + 3)
    assert b1.stretch_us() == pytest.approx(b1.kv_bytes / 4.5e6 / 0.95 + 2)
    swa = rows[-1]
    assert swa.kv_bytes == 256 * 128 * 8 * 512 and swa.attended_blocks == 256 * 8


def test_serving_rows_are_serving_shaped():
    rows = grid.serving_rows()
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    for r in rows:
        assert r.placement == "pool" and r.width == 8192 and r.group == "serving"
        assert r.batch in grid.S.CAPTURE_SIZES and len(r.seq_lens) == r.batch
        real = [n for n in r.seq_lens if n > 0]
        assert r.seq_lens[: len(real)] == tuple(real), "padding rows come last"
        assert max(real) <= 8192 * 16 and r.kv_heads in (1, 2, 8) and r.spec
    by = {r.name: r for r in rows}
    # The calls the performance goal was stated on, same shapes.
    s = by["srv_b32_logu32k"].summary
    assert (s.count, s.padding) == (32, 0) and s.min >= 100 and s.max <= 32768
    s = by["srv_s24_r20_1k8k"].summary
    assert (s.count, s.padding, s.min >= 1024, s.max <= 8192) == (24, 4, True, True)
    assert by["srv_b8_logu16k"].seq_lens == (5283, 1342, 137, 3300, 822, 2132, 5416, 2112)
    s = by["srv_b128_logu8k"].summary
    assert s.count == 128 and s.min >= 50 and s.max <= 8192
    assert by["srv_h1_b1_l64k"].seq_lens == (65536,) and by["srv_h1_b1_l64k"].kv_heads == 1
    assert by["srv_b1_l1k"].seq_lens == (1024,)
    s = by["swa128_srv_s64_r50"].summary
    assert (s.count, s.padding, by["swa128_srv_s64_r50"].window) == (64, 14, 128) and s.max <= 32768
    assert by["swa128_srv_b256_l8k"].seq_lens == (8192,) * 256
    # Sliding-window layers at the full rows' batch shapes.
    for r in rows:
        if r.name.startswith("swa128_srv_") and "srv_" + r.name[len("swa128_srv_"):] in by:
            full = by["srv_" + r.name[len("swa128_srv_"):]]
            assert full.seq_lens == r.seq_lens and full.kv_heads == r.kv_heads and r.window == 128
    assert any(r.kv_heads == 2 for r in rows) and any(r.summary.max >= 131072 for r in rows)


def test_every_row_has_an_fp8_twin():
    rows = grid.select_rows(None)
    assert len(rows) == 2 * len(grid.core_rows())
    rows = grid.select_rows("all")
    assert len(rows) == 2 * len(grid.default_grid())
    for bf16, fp8 in zip(rows[::2], rows[1::2]):
        assert fp8.name == bf16.name + "_fp8" and fp8.twin == bf16.name and fp8.kv_dtype == "fp8"
        assert fp8.seq_lens == bf16.seq_lens and fp8.kv_bytes * 2 == bf16.kv_bytes
        assert fp8.as_dtype("bf16") == bf16


def test_row_selection():
    sel = lambda names, **kw: [r.name for r in grid.select_rows(names, **kw)]  # noqa: E731
    assert sel("b1_l8k") == ["b1_l8k", "b1_l8k_fp8"]
    assert sel("b1_l8k", kv_dtypes=("fp8",)) == ["b1_l8k_fp8"]
    assert sel("b1_l8k_fp8,b1_l1k", kv_dtypes=("bf16",)) == ["b1_l8k_fp8", "b1_l1k"]
    assert len(sel("legacy", kv_dtypes=("bf16",))) == 15
    assert all(n.startswith("srv_") for n in sel("srv_*"))
    assert sel("custom:4,2,1000,64", kv_dtypes=("bf16",)) == ["b4_h2_l1000_w64"]
    assert sel(None, quick=True, kv_dtypes=("bf16",)) == list(grid.QUICK_ROWS)
    for bad in ("nope", "zz*", "custom:1,3,100"):
        with pytest.raises(ValueError):
            grid.select_rows(bad)


def test_sets_calls_and_checked_requests():
    target = 180 * 10**6
    for r in grid.select_rows(None):
        n = grid.num_sets(r, target)
        assert n * r.set_bytes >= target or n == 1
        calls = grid.num_calls(r, n, 4.5, 5000, 8, 1000)
        assert calls % n == 0 and calls >= max(8, n)
    r = grid.serving_rows()[1]  # 20 requests + 4 padding
    assert grid.check_requests(r)[-1] == 20 and 20 not in grid.check_requests(r, peers=True)
    assert grid.check_requests(grid.legacy_rows()[0]) == [0]


def test_largest_rows_fit_the_pool():
    """Every pool row's attended pages (all sets) draw from a 24 GiB pool."""
    blocks8 = 24 * 2**30 // (8 * 16 * 256 * 2)
    for r in grid.serving_rows():
        for d in ("bf16", "fp8"):
            t = r.as_dtype(d)
            assert t.attended_blocks <= blocks8 * (8 // r.kv_heads)
    big = next(r for r in grid.serving_rows() if r.name == "srv_h2_s48_logu128k")
    t = G.draw_tables(big, blocks8 * 4, 1, seed=0)
    assert t.shape == (1, 48, 8192)


def test_spec_rows():
    """The group "spec": Q = 2, 4, 8 twins of five core shapes, bytes of the
    union of each request's query tokens' spans, fp8 twins, selection."""
    rows = grid.spec_rows()
    names = [r.name for r in rows]
    assert names == [f"{b}_q{q}" for b in grid.SPEC_BASES for q in (2, 4, 8)] and len(rows) == 15
    core = {r.name: r for r in grid.core_rows()}
    for r in rows:
        base = core.get(r.name.rsplit("_q", 1)[0]) or grid.Row("b32_l1k", 32, 8, 1024)
        assert r.group == "spec" and r.q_tokens in (2, 4, 8) and r.shape == f"G8 D128 sinks Q{r.q_tokens}"
        assert (r.seq_lens, r.window, r.kv_heads, r.placement, r.width) == (
            base.seq_lens, base.window, base.kv_heads, base.placement, base.width)
        assert r.kv_bytes == attended_kv_bytes(r.seq_lens, r.window, r.kv_heads, 2, 128, r.q_tokens)
        assert r.as_dtype("fp8").kv_bytes * 2 == r.kv_bytes and r.as_dtype("fp8").q_tokens == r.q_tokens
        assert r.qo_bytes == r.q_tokens * base.qo_bytes
        if r.window is None:
            assert r.kv_bytes == base.kv_bytes  # every position read once, whatever Q
    by = {r.name: r for r in rows}
    swa = by["swa128_b16_l8k_q8"]  # the last 128 + 7 positions of each request
    assert swa.kv_window == 135 and swa.attended == 16 * 135 and swa.attended_blocks == 16 * 9
    assert by["srv_s24_r20_1k8k_q4"].summary.padding == 4 and by["h1_b8_l8k_q2"].kv_heads == 1
    sel = [r.name for r in grid.select_rows("spec")]
    assert len(sel) == 30 and sel[:2] == ["b1_l8k_q2", "b1_l8k_q2_fp8"]
    assert set(sel) <= {r.name for r in grid.select_rows("all")}
    assert [r.name for r in grid.select_rows("b1_l8k_q4_fp8")] == ["b1_l8k_q4_fp8"]
    custom = grid.parse_custom_row("4,2,1000,64,8,128,1,4")
    assert (custom.name, custom.q_tokens) == ("b4_h2_l1000_w64_q4", 4)
    with pytest.raises(ValueError):
        grid.parse_custom_row("4,2,1000,64,8,128,1,9")


# --- reporting ----------------------------------------------------------------------------


def _res(name, dtype, us, kv_bytes, **impls):
    res = {"row": name, "kv_dtype": dtype, "twin": name.removesuffix("_fp8"), "batch": 1, "kv_heads": 8,
           "seq_len": 8192, "window": None, "kv_bytes": kv_bytes, "floor_us": kv_bytes / 4.57e6,
           "goal_us": report.goal_us(kv_bytes), "stretch_us": report.goal_us(kv_bytes, report.STRETCH),
           "balance": {"flint": {"plan": "p", "max_pages": 5, "mean_pages": 4.0, "ratio": 1.25}},
           "impls": {"flint": {"status": "ok", "us": us}, **impls}}
    report.fill_rates(res, 4.57)
    return res


def test_compact_table_verdicts_and_ratios():
    rows = [_res("a", "bf16", 9.6, 33554432, **{"fi-xqa": {"status": "ok", "us": 16.0}}),
            _res("a_fp8", "fp8", 6.0, 16777216, **{"fi-xqa": {"status": "ok", "us": 5.0},
                                                    "vllm-triton": {"status": "missing", "reason": "x"}})]
    report.annotate(rows)
    assert rows[1]["fp8_bf16"] == {"flint": pytest.approx(6 / 9.6), "fi-xqa": pytest.approx(5 / 16)}
    table = report.compact_table(rows)
    line_a, line_fp8 = table.splitlines()[2:4]
    assert "| yes (stretch) |" in line_a and "1.25 (5/4.0)" in line_a and "| 16.0 |" in line_a
    assert "slower than fi-xqa" in line_fp8 and "| 0.62 |" in line_fp8 and "missing" in line_fp8
    summary = "\n".join(report.summary_lines(rows))
    assert "faster than fi-xqa on 1 of 1" in summary and "faster than fi-xqa on 0 of 1" in summary
    notes = "\n".join(report.notes(rows))
    assert "vllm-triton missing on a_fp8: x" in notes


def test_reference_run_renders(tmp_path):
    meta, ceiling, rows = report.load_json(REFERENCE_RUN)
    assert (meta["commit"], meta["gpu"].split(" (")[0]) == ("4bcdeba", "NVIDIA H200")
    assert len(rows) == 78 and sum(r["kv_dtype"] == "bf16" for r in rows) == 39
    block = report.results_block(meta, ceiling, rows)
    assert "| b1_l8k | 1 x 8192 | 11.3 |" in block
    assert "faster than fi-xqa on 39 of 39" in block
    pytest.importorskip("matplotlib")
    out = tmp_path / "perf.png"
    assert report.main(["--plot", str(REFERENCE_RUN), "--out", str(out)]) == 0
    assert out.stat().st_size > 20_000


# --- the worker on the CPU ----------------------------------------------------------------


def _fake_timer(fns, n_calls, warmup, reps):
    for f in fns:
        f()
    return 1.0 + 0.001 * len(fns), [1.0] * reps


def _small_row(window=None):
    lens = tuple(grid.S.pad_to_capture_size([300, 17, 1000, 64, 5]))  # 5 requests + 3 padding
    return grid.Row("t_srv" + (f"_w{window}" if window else ""), len(lens), 2, max(lens), window, lens, 64,
                    "pool", spec="test", group="serving")


def _plans_stub():
    """A stand-in for flint_attention.testing.plans (its test-only ops need a GPU)."""
    @dataclasses.dataclass(frozen=True)
    class Plan:
        name: str

        def balance(self, seq_lens, window, num_kv_heads):
            pages = [len(grid.S.page_span(n, window)) for n in seq_lens] * num_kv_heads
            return max(pages), sum(pages) / len(pages)

    m = types.ModuleType("flint_attention.testing.plans")
    m.default_plan = lambda q, kv_cache, window: Plan("default")
    m.split_rules_plan = lambda q, kv_cache, window: Plan("split")
    m.run_with_plan = lambda plan, *a, k_scale=None, v_scale=None: flint_decode_attention(
        *a, k_scale=k_scale, v_scale=v_scale)
    return m


def _worker(tmp_path, rows, impls, plans=None, monkeypatch=None):
    args = bench.parse_args(["--impls", impls, "--rows", "b1_l1k", "--row-budget-s", "1000"])
    args.row_list = rows
    if plans is not None:
        # Both places `from flint_attention.testing import plans` looks: the
        # package's attribute (set once any test imported the real module) and
        # sys.modules.
        import flint_attention.testing

        monkeypatch.setitem(sys.modules, "flint_attention.testing.plans", plans)
        monkeypatch.setattr(flint_attention.testing, "plans", plans, raising=False)
    state = {"meta": {"rotation_target_bytes": 1}, "ceiling": {"tbps": 4.5}, "rows": []}
    shared = G.SharedPools(64 * 64 * 1024, "cpu", seed=3, fp8=True)
    w = bench.Worker(args, G, torch, state, tmp_path / "run.json", deadline=1e18, timer=_fake_timer,
                     device="cpu")
    w.run(rows, shared)
    return w, {r["row"]: r for r in report.annotate(json.loads((tmp_path / "run.json").read_text())["rows"])}


@pytest.mark.parametrize("window", [None, 20])
def test_worker_on_the_cpu_path(tmp_path, window, monkeypatch):
    row = _small_row(window)
    rows = [row, row.as_dtype("fp8")]
    w, res = _worker(tmp_path, rows, "flint,flint-split,xqa,sdpa", _plans_stub(), monkeypatch)
    for name in (row.name, row.name + "_fp8"):
        r = res[name]
        assert "partial" not in r
        f = r["impls"]["flint"]
        assert f["status"] == "ok" and f["err"] < 1e-2 and f["checked"] == [0, 2, 4, 5], f
        assert r["impls"]["flint-split"]["status"] == "ok"
        assert r["impls"]["flint-split"]["note"] == "split plan split"
        assert r["impls"]["fi-xqa"]["status"] == "missing"  # no flashinfer here
        assert "sdpa" not in r["impls"]  # uniform bf16 rows only
        b = r["balance"]["flint"]
        assert b["plan"] == "default" and b["max_pages"] == max(len(grid.S.page_span(n, window))
                                                                 for n in row.seq_lens)
    assert res[row.name + "_fp8"]["fp8_bf16"]["flint"] == pytest.approx(1.0, rel=0.1)
    assert bench.in_progress(tmp_path / "run.json") is None


@pytest.mark.parametrize("window", [None, 20])
def test_worker_with_query_tokens_on_the_cpu_path(tmp_path, window, monkeypatch):
    """Rows of 4 query tokens per request: q and out [B, 4, H, D], tables over
    the union of the tokens' spans, Flint checked and probed on the CPU path."""
    srv = dataclasses.replace(_small_row(window), name="t_srv_q4", q_tokens=4)
    compact = grid.Row("t_compact_q4", 3, 1, 300, window, q_tokens=4)
    rows = [srv, srv.as_dtype("fp8"), compact]
    w, res = _worker(tmp_path, rows, "flint,xqa,sdpa", _plans_stub(), monkeypatch)
    for name in ("t_srv_q4", "t_srv_q4_fp8", "t_compact_q4"):
        r = res[name]
        f = r["impls"]["flint"]
        assert r["q_tokens"] == 4 and "Q4" in report.shape(r), r
        assert f["status"] == "ok" and f["err"] < 1e-2 and f["probe_err"] < 1e-2, f
        assert r["impls"]["fi-xqa"]["status"] == "missing" and "sdpa" not in r["impls"]
    inp = G.build_inputs(compact, {"bf16": 2}, None, seed=4, device="cpu")
    assert inp.qs[0].shape == (3, 4, 8, 128)
    span = grid.S.page_span(300, compact.kv_window)
    assert len(span) == len(grid.S.page_span(300, None if window is None else window + 3))
    for s in range(2):  # each set its own blocks: exactly the pages of the union of the spans
        ids = inp.tables[s][:, span.start:span.stop].flatten()
        assert set(ids.tolist()) == set(range(s * compact.attended_blocks, (s + 1) * compact.attended_blocks))


def test_draft_probe_catches_a_wrong_draft_mask():
    """A long request's output barely moves when the draft's causal mask is
    dropped (every token attending all positions); the probe's short
    requests fail the peers' bound."""
    row = grid.Row("t_probe", 1, 2, 4000, None, q_tokens=4)

    def no_draft_mask(p):  # every query token at the last position
        return torch.stack([reference_decode_attention(p.q[:, i], p.kv_cache, p.block_tables, p.seq_lens,
                                                       p.sinks, row.window, row.scale) for i in range(4)], 1)

    def exact(p):
        return reference_decode_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, p.sinks, row.window,
                                          row.scale).to(torch.bfloat16)

    cpu = torch.device("cpu")
    assert G.draft_probe(row, "bf16", cpu, exact, G.PEER_TOL["bf16"]) < 1e-2
    with pytest.raises(G.Mismatch, match="draft probe"):
        G.draft_probe(row, "bf16", cpu, no_draft_mask, G.PEER_TOL["bf16"])
    long = make_paged_inputs(1, [4000], 2, None, "cpu", seed=1, q_tokens=4, poison=False)
    rep = error_report(no_draft_mask(long), exact(long), G.PEER_TOL["bf16"])
    assert rep.ok(G.PEER_TOL["bf16"])  # why the probe: the row's own check cannot tell


def test_worker_reports_missing_plans_and_resumes(tmp_path):
    row = _small_row()
    w, res = _worker(tmp_path, [row], "flint,flint-split")
    r = res[row.name]
    # No GPU here: the plans module imports, but its test-only ops have no CPU
    # kernel (a CUDA build) or their extension is not built (a CPU-only build).
    assert r["impls"]["flint-split"]["status"] == "missing"
    reason = r["impls"]["flint-split"]["reason"]
    assert "plans unavailable" in reason or "flint_testing::split_rules_plan" in reason, reason
    error = r["balance"]["flint"]["error"]
    assert "plans unavailable" in error or "flint_testing::" in error, error
    # A lost worker's implementation in progress: recorded, its kind excluded.
    d = json.loads((tmp_path / "run.json").read_text())
    d["rows"][0]["impls"].pop("flint")
    (tmp_path / "run.json").write_text(json.dumps(d))
    bench.write_progress(tmp_path / "run.json", {"row": row.name, "impl": "flint", "phase": "timing",
                                                  "since": 0, "class": bench.impl_class("flint", row)})
    what = bench.record_lost_worker(tmp_path / "run.json", "hung: no progress for 30 s")
    assert what == f"{row.name} / flint: hung: no progress for 30 s during timing"
    assert bench.in_progress(tmp_path / "run.json") is None
    d = json.loads((tmp_path / "run.json").read_text())
    assert d["rows"][0]["impls"]["flint"]["status"] == "error"
    assert d["meta"]["excluded"][0]["class"] == ["flint", "bf16", False, True, 8, 128, True, 1]
    # A new worker resuming that JSON skips the kind of row it lost, runs the rest.
    other = dataclasses.replace(row, name="t_other")
    args = bench.parse_args(["--impls", "flint", "--rows", "b1_l1k"])
    state = {"meta": d["meta"], "ceiling": d["ceiling"], "rows": d["rows"]}
    w2 = bench.Worker(args, G, torch, state, tmp_path / "run.json", 1e18, timer=_fake_timer, device="cpu")
    w2.run([row, other], G.SharedPools(64 * 64 * 1024, "cpu", seed=3, fp8=False))
    rows = {r["row"]: r for r in json.loads((tmp_path / "run.json").read_text())["rows"]}
    assert rows[row.name]["impls"]["flint"]["status"] == "error"  # not re-run
    assert rows["t_other"]["impls"]["flint"]["status"] == "missing"
    assert "not run: hung" in rows["t_other"]["impls"]["flint"]["reason"]
    assert bench.record_lost_worker(tmp_path / "run.json", "rc 1") is None  # nothing in progress


def test_worker_budget_skips_rows(tmp_path):
    args = bench.parse_args(["--impls", "flint", "--rows", "b1_l1k", "--budget-s", "5"])
    state = {"meta": {"rotation_target_bytes": 1}, "ceiling": {"tbps": 4.5}, "rows": []}
    row = _small_row()
    w = bench.Worker(args, G, torch, state, tmp_path / "run.json", deadline=0, timer=_fake_timer, device="cpu")
    w.run([row], None)
    assert "skipped (--budget-s 5 spent): t_srv" in w.meta["skipped"][0] and state["rows"] == []


def test_legacy_row_inputs_and_sdpa_dense_copy():
    row = grid.Row("t_legacy", 2, 1, 300, 100)
    inp = G.build_inputs(row, {"bf16": 3, "fp8": 2}, None, seed=4, device="cpu")
    assert len(inp.tables) == 3 and inp.cache("bf16").shape[0] == 3 * row.attended_blocks
    for s in range(3):  # each set its own range of blocks
        span = grid.S.page_span(300, 100)
        ids = inp.tables[s][:, span.start:span.stop].flatten()
        assert set(ids.tolist()) == set(range(s * row.attended_blocks, (s + 1) * row.attended_blocks))
    G.build_dense(inp)
    k, v = inp.dense[1]
    b = 1
    span = grid.S.attended_span(300, 100)
    for j, p in enumerate((span.start, span.stop - 1)):
        blk = inp.tables[1][b, p // 16]
        want = inp.cache("bf16")[blk, 0, p % 16]
        got_pos = 0 if j == 0 else len(span) - 1
        assert torch.equal(k[b, 0, got_pos], want[:128]) and torch.equal(v[b, 0, got_pos], want[128:])


# --- peers --------------------------------------------------------------------------------


def test_peer_bounds_catch_wrong_semantics():
    """The looser peer bounds still fail a dropped sink, a wrong window and
    mixed-up fp8 scales on the benchmark's inputs."""
    row = _small_row(window=None)
    lens = row.seq_lens
    inp = G.build_inputs(row, {"bf16": 1, "fp8": 1}, G.SharedPools(64 * 64 * 1024, "cpu", 1, True), 2, "cpu")
    idx = grid.check_requests(row, peers=True)
    sel = torch.tensor(idx)
    q, bt, sl = inp.qs[0][sel], inp.tables[0][sel], inp.seq_lens[sel]
    scale = 128**-0.5
    for dtype in ("bf16", "fp8"):
        kv, (ks, vs) = inp.cache(dtype), inp.scales(dtype)
        good = G.reference(inp, dtype, idx)
        wrong = {
            "no sinks": reference_decode_attention(q, kv, bt, sl, inp.sinks - 1e9, None, scale, ks, vs),
            "window 256": reference_decode_attention(q, kv, bt, sl, inp.sinks, 256, scale, ks, vs),
        }
        if dtype == "fp8":
            wrong["k/v scales swapped"] = reference_decode_attention(q, kv, bt, sl, inp.sinks, None, scale, vs, ks)
        tol = G.PEER_TOL[dtype]
        for what, out in wrong.items():
            rep = error_report(out, good, tol)
            assert not rep.ok(tol) and rep.rel_fro > 2 * tol.rel_fro, (dtype, what, rep.rel_fro)
    assert max(lens) == 1000


def test_xqa_scale_mapping_and_kwargs():
    assert "scale mapping ok" in peer_xqa.cpu_check()
    kv = torch.zeros(4, 2, 16, 256).to(torch.float8_e4m3fn)
    q = torch.zeros(2, 16, 128, dtype=torch.bfloat16)
    kw = peer_xqa.call_kwargs(q, kv, None, None, None, None, 128, 0.1, None, 64, 0.5, 0.25)
    assert (kw["bmm1_scale"], kw["bmm2_scale"], kw["window_left"]) == (0.05, 0.25, 127)
    k, v = kw["kv_cache"]
    assert k.shape == (4, 2, 16, 128) and v.data_ptr() == kv.data_ptr() + 128
    kw = peer_xqa.call_kwargs(q, kv.to(torch.bfloat16), None, None, None, None, None, 0.1, None, 64)
    assert (kw["bmm1_scale"], kw["bmm2_scale"], kw["window_left"]) == (0.1, 1.0, -1)
    assert "q_len_per_req" not in kw and "mask" not in kw
    # 4 query tokens per request: [B * Q, H, D] views, q_len_per_req and the causal draft mask.
    q4 = torch.zeros(2, 4, 16, 128, dtype=torch.bfloat16)
    out4 = torch.empty_like(q4)
    mask = peer_xqa.causal_mask(2, 4)
    assert mask.dtype == torch.uint16 and mask.shape == (2, 4, 2)
    assert mask.view(torch.int32)[1, :, 0].tolist() == [1, 3, 7, 15] and not mask.view(torch.int32)[..., 1:].any()
    kw = peer_xqa.call_kwargs(q4, kv, None, None, None, None, 128, 0.1, out4, 64, 0.5, 0.25, mask=mask)
    assert kw["query"].shape == (8, 16, 128) and kw["query"].data_ptr() == q4.data_ptr()
    assert kw["out"].shape == (8, 16, 128) and kw["out"].data_ptr() == out4.data_ptr()
    assert kw["q_len_per_req"] == 4 and kw["mask"] is mask and kw["window_left"] == 127
    with pytest.raises(ValueError, match="draft mask"):
        peer_xqa.call_kwargs(q4, kv, None, None, None, None, None, 0.1, out4, 64, 0.5, 0.25)
    assert peer_xqa.variant(True, False, 128, 8, 4) == (True, False, 128, 8, 4)
    assert peer_xqa.module_args(False, True, 128, 8, 4)[-2:] == (4, False)
    assert peer_xqa.describe(peer_xqa.variant(True, True, 128, 8, 8)) == "fp8 sliding D128 G8 Q8"


def test_vllm_loader_with_stand_in_files(tmp_path):
    """The stubs (platform, logger, triton_utils, envs, KVQuantMode) and the
    argument mapping, on stand-in files shaped like vLLM's modules."""
    pytest.importorskip("triton")
    (tmp_path / "triton_attention_helpers.py").write_text(
        "from vllm.triton_utils import tl, triton\nHELPER = 1\n")
    (tmp_path / "triton_unified_attention.py").write_text(
        "import torch\nimport vllm.envs as envs\nfrom vllm.logger import init_logger\n"
        "from vllm.platforms import current_platform\nfrom vllm.triton_utils import tl, triton\n"
        "from vllm.v1.attention.ops.triton_attention_helpers import HELPER\n"
        "from vllm.v1.kv_cache_interface import KVQuantMode\n"
        "logger = init_logger(__name__)\nlogger.debug_once('x')\n"
        "is_batch_invariant = envs.VLLM_BATCH_INVARIANT\n"
        "float8_info = torch.finfo(current_platform.fp8_dtype())\n"
        "def unified_attention(**kw):\n    return kw\n"
        "kernel_unified_attention = reduce_segments = None\n")
    m = peer_vllm.load(tmp_path)
    assert m.float8_info.max == 448 and m.KVQuantMode.FP8_PER_TENSOR == 1 and not m.is_batch_invariant
    assert peer_vllm.split_threshold(8) == 16 and peer_vllm.split_threshold(2) == 64
    assert peer_vllm.split_threshold(1) == 128
    kv = torch.zeros(4, 2, 16, 256).to(torch.float8_e4m3fn)
    q = torch.zeros(3, 16, 128, dtype=torch.bfloat16)
    ks, vs = torch.tensor([0.5]), torch.tensor([0.25])
    scratch = peer_vllm.make_scratch(16, 2, "cpu")
    kw = peer_vllm.decode_kwargs(m, q, kv, torch.zeros(3, 4, dtype=torch.int32), torch.ones(3, dtype=torch.int32),
                                 torch.zeros(16), 128, 0.1, torch.empty_like(q), scratch, 64, ks, vs)
    assert kw["window_size"] == (127, 0) and kw["kv_quant_mode"] == m.KVQuantMode.FP8_PER_TENSOR
    assert kw["k"].shape == (4, 16, 2, 128) and kw["v"].stride() == kv.transpose(1, 2).stride()
    assert kw["cu_seqlens_q"].tolist() == [0, 1, 2, 3] and kw["k_descale"].shape == (3, 2)
    assert float(kw["v_descale"][2, 1]) == 0.25 and kw["seq_threshold_3D"] == 64
    with pytest.raises(ValueError):
        peer_vllm.decode_kwargs(m, q, kv, None, None, None, None, 0.1, None, scratch, 64, torch.ones(2), vs)
    # 4 query tokens per request: [B * Q, H, D] views, cu_seqlens_q in steps of Q, max_seqlen_q Q.
    q4 = torch.zeros(3, 4, 16, 128, dtype=torch.bfloat16)
    out4 = torch.empty_like(q4)
    scratch4 = peer_vllm.make_scratch(16, 2, "cpu", 128, 4)
    assert scratch4["softmax_segm_max"].shape[0] == 4 * 64 and scratch4["seq_threshold_3D"] == 64
    kw = peer_vllm.decode_kwargs(m, q4, kv, torch.zeros(3, 4, dtype=torch.int32), torch.ones(3, dtype=torch.int32),
                                 None, None, 0.1, out4, scratch4, 64, ks, vs)
    assert kw["q"].shape == (12, 16, 128) and kw["q"].data_ptr() == q4.data_ptr()
    assert kw["out"].shape == (12, 16, 128) and kw["out"].data_ptr() == out4.data_ptr()
    assert kw["cu_seqlens_q"].tolist() == [0, 4, 8, 12] and kw["max_seqlen_q"] == 4
    assert kw["k_descale"].shape == (3, 2)
    # The split-K path: num_seqs x cdiv(Q, BLOCK_Q) <= seq_threshold_3D, BLOCK_Q = 16 // G.
    assert peer_vllm.block_q(8) == 2 and peer_vllm.block_q(12) == 1 and peer_vllm.block_q(4) == 4
    assert peer_vllm.uses_split_kernel(4, 8, 8, 8) and not peer_vllm.uses_split_kernel(5, 8, 8, 8)
    assert peer_vllm.uses_split_kernel(8, 8, 4, 8) and not peer_vllm.uses_split_kernel(32, 8, 2, 8)
    assert peer_vllm.uses_split_kernel(16, 8) and not peer_vllm.uses_split_kernel(17, 8)


@pytest.mark.skipif(not (peer_vllm.PEER_DIR / "triton_unified_attention.py").exists(),
                    reason="vLLM's Triton attention is not extracted here (.peers/vllm_triton, benchmarks/peers/README.md)")
def test_vllm_peer_under_the_triton_interpreter(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(bench.PEER_VLLM), "--cpu-check"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    # 8 at G 8, D 128; 2 at each of the models' 6 shapes; 8 at 4 query tokens, 2 at 2 and at 8
    assert done.stdout.count(": ok") == 32
    # The compile-ahead path, through the wrapper (the interpreter compiles nothing).
    specs = [peer_vllm.warm_spec(r.batch, r.kv_heads, r.window, r.kv_dtype, r.width)
             for r in grid.select_rows("srv_s24_r20_1k8k,swa128_srv_h1_s8_logu128k")]
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    done = subprocess.run([sys.executable, str(bench.PEER_VLLM), "--warm", str(tmp_path / "specs.json")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and "4 of 4 compiled" in done.stderr, done.stderr


def test_compile_ahead_partition_and_stand_in():
    specs = [peer_vllm.warm_spec(r.batch, r.kv_heads, r.window, r.kv_dtype, r.width)
             for r in grid.select_rows("all")]
    parts = peer_vllm.partition(specs, 3)
    assert len(parts) == 3 and sorted(map(str, sum(parts, []))) == sorted(map(str, specs))
    groups = [{peer_vllm.compile_group(s) for s in p} for p in parts]
    assert not (groups[0] & groups[1]) and not (groups[1] & groups[2])  # a group in one process
    calls = []
    fake = types.SimpleNamespace(run=lambda *a, grid, warmup, **kw: calls.append((grid, warmup, kw)))
    peer_vllm._CompileOnly(fake)[(3, 8)](x=1)
    assert calls == [((3, 8), True, {"x": 1})]


def test_dry_run(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / "bench_decode.py"), "--dry-run", "--rows",
                           "b1_l1k,srv_s24_r20_1k8k,swa128_srv_s64_r50", "--impls", "flint,xqa",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| srv_s24_r20_1k8k_fp8 | 20+4p: 1277/4283.5/7927 |" in done.stdout
    assert (tmp_path / "bench_dryrun.json").exists()
    assert math.isfinite(json.loads((tmp_path / "bench_dryrun.json").read_text())["rows"][0]["goal_us"])


def _cpu_run(tmp_path, fault: str = "", *extra):
    """The whole run (supervisor, worker, JSON, report) on the CPU path."""
    env = dict(os.environ, FLINT_BENCH_TEST_FAULT=fault)
    cmd = [sys.executable, str(BENCH / "bench_decode.py"), "--device", "cpu", "--ceiling", "4.5",
           "--rotation-mb", "0.2", "--reps", "1", "--warmup", "0", "--min-calls", "1", "--max-calls", "2",
           "--rows", "custom:2,1,100;custom:3,1,200", "--impls", "flint", "--no-plot",
           "--json", str(tmp_path / "run.json"), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    rows = {r["row"]: r for r in json.loads((tmp_path / "run.json").read_text())["rows"]}
    return done, rows


def test_cpu_run_recovers_from_a_crashed_worker(tmp_path):
    done, rows = _cpu_run(tmp_path, "crash:b2_h1_l100:flint")
    assert done.returncode == 0, done.stderr
    assert "restarting the worker (1 of at most 3)" in done.stderr
    assert rows["b2_h1_l100"]["impls"]["flint"]["reason"] == "worker exited with rc 9 during timing"
    assert rows["b3_h1_l200"]["impls"]["flint"]["status"] == "missing"  # same kind of row: not run
    assert rows["b2_h1_l100_fp8"]["impls"]["flint"]["status"] == "ok"  # another kind: run
    assert rows["b3_h1_l200_fp8"]["impls"]["flint"]["status"] == "ok"
    assert "| b2_h1_l100_fp8 | 2 x 100 |" in done.stdout and "json:" in done.stdout


def test_cpu_run_recovers_from_a_hung_worker(tmp_path):
    done, rows = _cpu_run(tmp_path, "hang:b3_h1_l200_fp8:flint", "--impl-timeout-s", "3")
    assert done.returncode == 0, done.stderr
    assert rows["b3_h1_l200_fp8"]["impls"]["flint"]["reason"] == "hung: no progress for 3 s during timing"
    assert all(rows[n]["impls"]["flint"]["status"] == "ok" for n in ("b2_h1_l100", "b2_h1_l100_fp8",
                                                                     "b3_h1_l200"))
