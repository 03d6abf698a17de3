"""Where a balanced call's time goes: the balanced kernel built with %globaltimer
stamps at its phases (flint_testing.balanced_phases; the phases are
BalancedPhase in csrc/decode_attention/kernel_balanced.cuh), in a CUDA graph of
back-to-back calls over L2-cold input sets, as quick_ab.py times them. For each
row it prints, for the middle call of the chain, each phase's time from the
call's first CTA entry (min / median / max over the warps that reach it), the
call's span (first entry to last stamp) and the period between calls' entries.

    python benchmarks/phases_row.py [--rows b1_l8k,h1_tp_64k] [--kv bf16,fp8]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import flint_attention  # noqa: F401  (the op library first: _testing links to it)
import flint_attention._testing  # noqa: F401  (torch.ops.flint_testing)
from flint_attention.testing import FP8, plans

import quick_ab

PHASES = ["entered", "divided", "leading", "waited", "streamed", "cta_ready", "cta_merged",
          "arrived", "finished"]
SCALE = 128**-0.5


def run_row(name, kv):
    lens, kvh, window, width = quick_ab.ROWS[name]
    kv_dtype = FP8 if kv == "fp8" else torch.bfloat16
    sets = quick_ab.make_sets(lens, kvh, window, width, kv_dtype)
    s0 = sets[0]
    ctas = torch.ops.flint_testing.division(s0.q, s0.kv_cache, s0.block_tables, s0.seq_lens,
                                            window, plans.balanced_plan(s0.kv_cache).to_ints())[0]
    n = max(len(sets), 24)
    stamps = [torch.zeros(ctas, 8, len(PHASES), dtype=torch.int64, device="cuda")
              for _ in range(n)]

    def call(i):
        s = sets[i % len(sets)]
        torch.ops.flint_testing.balanced_phases(s.q, s.kv_cache, s.block_tables, s.seq_lens,
                                                s.sinks, window, SCALE, s.out, s.k_scale,
                                                s.v_scale, stamps[i])

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
    mid = n // 2
    x = st[mid]
    t0 = entries[mid]
    print(f"\n{name} {kv}: {ctas} CTAs, {n} calls in the graph; period between calls' first "
          f"entries median {statistics.median(periods):.2f} us; call {mid}'s span "
          f"{(int(x.max()) - t0) / 1e3:.2f} us (its last stamp); the previous call's last stamp "
          f"at {(int(st[mid - 1].max()) - t0) / 1e3:.2f} us, the next call's first entry at "
          f"{(entries[mid + 1] - t0) / 1e3:.2f} us")
    print("| phase | warps | min µs | median µs | max µs |\n|---|---|---|---|---|")
    for k, ph in enumerate(PHASES):
        v = x[..., k].flatten()
        v = v[v > 0]
        if v.numel() == 0:
            print(f"| {ph} | 0 | | | |")
            continue
        us = ((v - t0).double() / 1e3).sort().values
        print(f"| {ph} | {v.numel()} | {us[0]:.2f} | {us[us.numel() // 2]:.2f} | {us[-1]:.2f} |")
    # Per CTA: when its first warp entered and its last warp streamed.
    enter = (x[..., 0].min(dim=1).values - t0).double() / 1e3
    streamed = (x[..., 4].max(dim=1).values - t0).double() / 1e3
    print(f"CTA entries: median {enter.median():.2f}, max {enter.max():.2f} us; CTA streams end: "
          f"median {streamed.median():.2f}, max {streamed.max():.2f} us")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="b1_l8k,h1_tp_64k,b1_l1k_w8192,swa128_b64,pad24,b64_l8k")
    ap.add_argument("--kv", default="bf16,fp8")
    args = ap.parse_args()
    for name in args.rows.split(","):
        for kv in args.kv.split(","):
            run_row(name, kv)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
