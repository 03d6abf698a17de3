"""Where a call's time goes: the balanced kernel, or with `--kernel split` the
9-warp split kernel (the plan of calls with at most 8 (request, kv head)
pairs), built with %globaltimer stamps at its phases
(flint_testing.balanced_phases / split_phases; the phases are BalancedPhase and
SplitPhase in csrc/decode_attention/probes.cuh), in a
CUDA graph of back-to-back calls over L2-cold input sets, as quick_ab.py times
them. For each row it prints, for the middle call of the chain, each phase's
time from the call's first CTA entry (min / median / max over the warps that
reach it), the call's span (first entry to last stamp) and the period between
calls' entries; for the balanced kernel also per warp its stream time by the
pieces in its share, split into the stream's sections (StreamSection in
csrc/decode_attention/probes.cuh).

    python tools/phases_row.py [--rows b1_l8k,h1_tp_64k] [--kv bf16,fp8] [--kernel split]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository's packages import as under `python -m`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import flint_attention  # noqa: F401,E402  (the op library first: _testing links to it)
import flint_attention._testing  # noqa: F401,E402  (torch.ops.flint_testing)
from flint_attention.testing import FP8, plans  # noqa: E402
from flint_attention.testing.serving import page_span  # noqa: E402
from tools import quick_ab  # noqa: E402

PHASES = ["entered", "divided", "leading", "waited", "streamed", "cta_ready", "cta_merged",
          "arrived", "finished"]
# A warp's stream cycles by StreamSection (csrc/decode_attention/probes.cuh), then its pieces.
SECTIONS = ["setup", "first_wait", "page_wait", "refill_sync", "refill_arrive", "refill_copy",
            "refill", "page_math", "piece_end"]
STAMPS = len(PHASES) + len(SECTIONS) + 1
# The split kernel's phases (SplitPhase in csrc/decode_attention/probes.cuh).
SPLIT_PHASES = ["entered", "shared", "leading", "waited", "streamed", "cta_merged", "arrived",
                "finished"]
SPLIT_WARPS = 9
SCALE = 128**-0.5


def replay_stamps(call, stamps):
    """Runs call(i) for every stamps[i] eagerly, captures them as one graph,
    replays it twice (the second with zeroed stamps) and returns the stamps on
    the CPU, the calls' first entries and the periods between them (µs)."""
    n = len(stamps)
    for i in range(n):
        call(i)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(n):
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    for st in stamps:  # a warp that does not reach a phase in the replay read leaves it 0
        st.zero_()
    graph.replay()
    torch.cuda.synchronize()
    st = [x.cpu() for x in stamps]
    entries = [int(x[..., 0][x[..., 0] > 0].min()) for x in st]
    periods = [(b - a) / 1e3 for a, b in zip(entries, entries[1:])]
    return st, entries, periods


def phase_table(name, kv, ctas, st, entries, periods, phases):
    """The middle call's span and each phase's times from its first entry;
    returns that call's stamps and entry."""
    n = len(st)
    mid = n // 2
    x = st[mid]
    t0 = entries[mid]
    print(f"\n{name} {kv}: {ctas} CTAs, {n} calls in the graph; period between calls' first "
          f"entries median {statistics.median(periods):.2f} us; call {mid}'s span "
          f"{(int(x.max()) - t0) / 1e3:.2f} us (its last stamp); the previous call's last stamp "
          f"at {(int(st[mid - 1].max()) - t0) / 1e3:.2f} us, the next call's first entry at "
          f"{(entries[mid + 1] - t0) / 1e3:.2f} us")
    print("| phase | warps | min µs | median µs | max µs |\n|---|---|---|---|---|")
    for k, ph in enumerate(phases):
        v = x[..., k].flatten()
        v = v[v > 0]
        if v.numel() == 0:
            print(f"| {ph} | 0 | | | |")
            continue
        us = ((v - t0).double() / 1e3).sort().values
        print(f"| {ph} | {v.numel()} | {us[0]:.2f} | {us[us.numel() // 2]:.2f} | {us[-1]:.2f} |")
    return x, t0


def row_sets(name, kv):
    lens, kvh, window, width = quick_ab.ROWS[name]
    kv_dtype = FP8 if kv == "fp8" else torch.bfloat16
    return lens, kvh, window, quick_ab.make_sets(lens, kvh, window, width, kv_dtype)


def run_row(name, kv):
    lens, kvh, window, sets = row_sets(name, kv)
    s0 = sets[0]
    ctas, _, total, per_warp, _, cost = torch.ops.flint_testing.division(
        s0.q, s0.kv_cache, s0.block_tables, s0.seq_lens, window,
        plans.balanced_plan(s0.kv_cache).to_ints())
    stamps = [torch.zeros(ctas, 8, STAMPS, dtype=torch.int64, device="cuda")
              for _ in range(max(len(sets), 24))]

    def call(i):
        s = sets[i % len(sets)]
        torch.ops.flint_testing.balanced_phases(s.q, s.kv_cache, s.block_tables, s.seq_lens,
                                                s.sinks, window, SCALE, s.out, s.k_scale,
                                                s.v_scale, stamps[i])

    st, entries, periods = replay_stamps(call, stamps)
    x, t0 = phase_table(name, kv, ctas, st, entries, periods, PHASES)
    # Per CTA: when its first warp entered and its last warp streamed.
    enter = (x[..., 0].min(dim=1).values - t0).double() / 1e3
    streamed = (x[..., 4].max(dim=1).values - t0).double() / 1e3
    print(f"CTA entries: median {enter.median():.2f}, max {enter.max():.2f} us; CTA streams end: "
          f"median {streamed.median():.2f}, max {streamed.max():.2f} us")
    per_warp_report(x, t0, s0.seq_lens.tolist(), kvh, window, total, per_warp, cost)


def run_split_row(name, kv):
    lens, kvh, window, sets = row_sets(name, kv)
    s0 = sets[0]
    plan = plans.split_rules_plan(s0.q, s0.kv_cache, window)
    if plan.kind != "split" or plan.warps != SPLIT_WARPS:
        print(f"\n{name} {kv}: the split plan is {plan.name}; the probe is built for the "
              f"{SPLIT_WARPS}-warp splits only (<= 8 pairs): skipped")
        return
    ctas = plan.splits * kvh * len(lens)
    stamps = [torch.zeros(ctas, SPLIT_WARPS, len(SPLIT_PHASES), dtype=torch.int64, device="cuda")
              for _ in range(max(len(sets), 24))]
    ints = plan.to_ints()

    def call(i):
        s = sets[i % len(sets)]
        torch.ops.flint_testing.split_phases(s.q, s.kv_cache, s.block_tables, s.seq_lens, s.sinks,
                                             window, SCALE, s.out, s.k_scale, s.v_scale,
                                             stamps[i], ints)

    st, entries, periods = replay_stamps(call, stamps)
    x, t0 = phase_table(f"{name} ({plan.name})", kv, ctas, st, entries, periods, SPLIT_PHASES)
    # Per CTA with pages: its first entry and its last warp's stream end.
    active = x[..., 4].max(dim=1).values > 0
    if bool(active.any()):
        enter = (x[active][..., 0].min(dim=1).values - t0).double() / 1e3
        streamed = (x[active][..., 4].max(dim=1).values - t0).double() / 1e3
        print(f"{int(active.sum())} CTAs streamed: entries median {enter.median():.2f}, max "
              f"{enter.max():.2f} us; their streams end median {streamed.median():.2f}, max "
              f"{streamed.max():.2f} us")


def warp_pieces(lens, kvh, window, total, per_warp, num_warps, cost):
    """Per warp of the grid (CTA-major): its share's pages and pieces (segments
    whose pages it touches), by the division's rule (csrc/decode_attention/
    division.h: a segment is `cost` units, then one unit per page; the rows'
    tables hold every length, so no length is clamped, and the total must match
    the device's)."""
    segs = []  # (unit of page 0, pages) of each segment, b-major
    x = 0
    for seq in lens:
        pages = len(page_span(seq, window))
        for _ in range(kvh if pages > 0 else 0):
            segs.append((x + cost, pages))
            x += cost + pages
    assert x == total, (x, total)
    out = []
    for w in range(num_warps):
        x0, x1 = w * per_warp, min((w + 1) * per_warp, total)
        pieces = [min(x1, a + n) - max(x0, a) for a, n in segs if max(x0, a) < min(x1, a + n)]
        out.append((sum(pieces), len(pieces), x1 - x0 == per_warp))
    return out


def per_warp_report(x, t0, lens, kvh, window, total, per_warp, cost):
    """Which warps end late: each warp's stream (its kWaited to kStreamed
    stamps) against its share's pieces, and whether the late ones share CTAs."""
    ctas, warps = x.shape[0], x.shape[1]
    shares = warp_pieces(lens, kvh, window, total, per_warp, ctas * warps, cost)
    rows = []
    for c in range(ctas):
        for w in range(warps):
            pages, pieces, whole = shares[c * warps + w]
            if pages == 0 or x[c, w, 4] == 0:
                continue
            waited = (int(x[c, w, 3]) - t0) / 1e3
            end = (int(x[c, w, 4]) - t0) / 1e3
            cyc = [int(v) for v in x[c, w, len(PHASES):len(PHASES) + len(SECTIONS)]]
            # cycles -> µs: the sections partition the warp's waited -> streamed span
            us = [v * (end - waited) / max(sum(cyc), 1) for v in cyc]
            rows.append((end, end - waited, waited, pieces, pages, c, w, us,
                         int(x[c, w, STAMPS - 1]), whole))
    if not rows:
        return
    full = [r for r in rows if r[9]]  # warps with a whole share
    print(f"per warp ({len(full)} with a whole share of {per_warp} units, median "
          f"{statistics.median(r[4] for r in full)} pages): stream time "
          "(waited -> streamed) by pieces in the share")
    print("| pieces | warps | median pages | median stream µs | max stream µs | median end µs | "
          "max end µs | " + " | ".join(f"{n} µs" for n in SECTIONS)
          + " |\n|---|---|---|---|---|---|---|" + "---|" * len(SECTIONS))
    by = sorted(set(r[3] for r in full))
    qs = [by[int(len(by) * f)] for f in (0, 0.25, 0.5, 0.75)] + [by[-1] + 1]
    for lo, hi in zip(qs, qs[1:]):
        g = [r for r in full if lo <= r[3] < hi]
        if g:
            secs = " | ".join(f"{statistics.median(r[7][k] for r in g):.2f}"
                              for k in range(len(SECTIONS)))
            print(f"| {lo}..{hi - 1} | {len(g)} | {statistics.median(r[4] for r in g)} | "
                  f"{statistics.median(r[1] for r in g):.2f} | "
                  f"{max(r[1] for r in g):.2f} | {statistics.median(r[0] for r in g):.2f} | "
                  f"{max(r[0] for r in g):.2f} | {secs} |")
    assert all(r[8] == r[3] for r in full), "the probe's pieces differ from the division's"
    cta_med = {c: statistics.median(r[0] for r in rows if r[5] == c) for c in set(r[5] for r in rows)}
    print("slowest 12 warps: end µs, stream µs, waited µs, pieces, pages, CTA, warp, CTA's median end")
    for r in sorted(rows, reverse=True)[:12]:
        print(f"  {r[0]:.2f} {r[1]:.2f} {r[2]:.2f} {r[3]} {r[4]} cta{r[5]} w{r[6]} "
              f"{cta_med[r[5]]:.2f} sections " + " ".join(f"{v:.1f}" for v in r[7]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="b1_l8k,h1_tp_64k,b1_l1k_w8192,swa128_b64,pad24,b64_l8k")
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument("--kernel", choices=["balanced", "split"], default="balanced")
    args = ap.parse_args()
    for name in args.rows.split(","):
        for kv in args.kv.split(","):
            (run_split_row if args.kernel == "split" else run_row)(name, kv)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
