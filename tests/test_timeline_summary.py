"""benchmarks/timeline.py's summary of saved stamps (no GPU): the period and,
per (request, kv head) in launch order, the median entry and the end, both
after the previous call's end."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_grid as grid  # noqa: E402
import timeline  # noqa: E402


def synthetic_stamps(calls: int, period_ns: int) -> np.ndarray:
    """2 pairs x 2 splits (4 CTAs); split 1 of pair 0 is idle (entry only, and
    early: it must not count).
    Call i ends at (i + 1) x period; pair 1 enters 300 ns before the previous
    end and ends with the call, pair 0 enters 2000 ns before it and ends 1000
    ns before the call does."""
    t = np.zeros((calls, 4, len(timeline.STAMPS), 2), dtype=np.int64)
    base = 1_700_000_000_000_000_000  # %globaltimer: ns since 1970
    for i in range(calls):
        prev_end = base + i * period_ns
        end = prev_end + period_ns
        for cta, (entry, exit_) in enumerate([(-2000, period_ns - 1000), (-5000, None),
                                              (-300, period_ns), (-300, period_ns - 10)]):
            t[i, cta, 0, 0] = prev_end + entry
            if exit_ is None:
                continue
            for k in range(1, len(timeline.STAMPS)):  # phases in order, then the exit
                t[i, cta, k, 0] = prev_end + entry + k
            t[i, cta, timeline.EXIT, 0] = prev_end + exit_
        assert t[i, :, timeline.EXIT, 0].max() == end
    t[..., 1] = t[..., 0] - base  # clocks: any increasing count
    return t


def test_summary_per_pair_entry_and_end():
    row = grid.Row("b1_l8k", 1, 2, 8192)
    r = timeline.summarize(row, (2, 8, 2, 1, 0), synthetic_stamps(6, 10_000), 1, 1, 1.0)
    assert abs(r["period_us"] - 10.0) < 1e-9
    assert [round(p["entry_us"], 6) for p in r["pairs"]] == [-2.0, -0.3]
    assert [round(p["end_us"], 6) for p in r["pairs"]] == [9.0, 10.0]
    assert abs(r["period_mean_us"] - 10.0) < 1e-9
    assert [round(x, 6) for x in r["period_p10_p90_us"]] == [10.0, 10.0]
    # Every active CTA enters before the previous call's end; stamps 1 ns apart.
    assert r["late_entries"]["per_call"] == 0.0
    assert round(r["late_entries"]["others_prologue_us"], 6) == 0.003


def test_summary_counts_late_entries():
    """Pair 1 entering 100 ns after the previous call's end (seq_len, block ids
    and prologue each 100 ns later) instead of before it: its 2 CTAs are late,
    the idle split and pair 0 are not."""
    t = synthetic_stamps(6, 10_000)
    for i in range(1, 6):
        prev_end = t[i - 1, :, timeline.EXIT, 0].max()
        for k in range(timeline.PROLOGUE + 1):  # entry .. prologue 100 ns apart
            t[i, 2:, k, 0] = prev_end + 100 * (k + 1)
    t[..., 1] = t[..., 0] - t[..., 0].min()
    row = grid.Row("b1_l8k", 1, 2, 8192)
    r = timeline.summarize(row, (2, 8, 2, 1, 0), t, 1, 1, 1.0)
    assert r["late_entries"]["per_call"] == 2.0
    assert round(r["late_entries"]["prologue_us"], 6) == 0.3
    assert [round(x, 6) for x in r["late_entries"]["parts_us"]["late"]] == [0.1, 0.1, 0.1]
    assert round(r["late_entries"]["others_prologue_us"], 6) == 0.003
    assert [round(x, 6) for x in r["late_entries"]["parts_us"]["others"]] == [0.001] * 3


def test_summary_has_no_pairs_for_warp_per_head():
    row = grid.Row("swa128_b1_l8k", 1, 2, 8192, 128)
    r = timeline.summarize(row, (0, 4, 2, 1, 0), synthetic_stamps(4, 10_000), 1, 1, 1.0)
    assert r["pairs"] == []
