"""A quick A/B of launch plans on a few shapes, in one short GPU call: the op's
default plan against the split kernels' plan and the balanced kernel's (and,
with --variants, the refill rule forced either way),
CUDA-graph replay of back-to-back calls rotating over input sets of >= 200 MB
(L2 cold), median of 15 replays. Each output is checked against float64 first.
The full benchmark (peers, every row, JSON) is bench_decode.py; this is for a
first look at a kernel change.

    python tools/quick_ab.py [--rows a,b] [--plans default,split,balanced] [--variants]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time

import torch

from flint_attention.testing import BF16_VS_F64, FP8, error_report, make_paged_inputs, plans
from flint_attention.testing import reference_decode_attention as reference

SCALE = 128**-0.5


def lognormal_lens(n, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g)
    return [int(math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo)))) for x in u.tolist()]


# name -> (seq_lens, kv heads, window, block-table width in blocks or None)
ROWS = {
    "b1_l1k": ([1024], 8, None, None),
    "b1_l1k_w8192": ([1024], 8, None, 8192),
    "b1_l8k": ([8192], 8, None, None),
    "h1_b8_l8k": ([8192] * 8, 1, None, None),
    "b4_l8k": ([8192] * 4, 8, None, None),
    "b64_l8k": ([8192] * 64, 8, None, None),
    "h1_tp_64k": ([65536], 1, None, 8192),
    # <= 8 (request, kv head) pairs at long contexts: the 9-warp split plan
    # (the bench rows b1_l32k, srv_h1_s2_l128k and srv_h2_s4_l128k's shapes).
    "b1_l32k": ([32768], 8, None, None),
    "h1_b2_l128k": ([131072] * 2, 1, None, None),
    "h2_s4_l128k": ([104580, 112926, 130973, 0], 2, None, 8192),
    "logu32": (lognormal_lens(32, 100, 32768, 1), 8, None, 8192),
    "pad24": (lognormal_lens(20, 1000, 8192, 2) + [0] * 4, 8, None, 8192),
    "b8_logu16k": (lognormal_lens(8, 100, 16384, 6), 8, None, 8192),
    "b16_l8k": ([8192] * 16, 8, None, None),
    "b8_l32k": ([32768] * 8, 8, None, None),
    "b12_skew": ([131072] + [1024] * 11, 8, None, 8192),
    "b16_logu32k": (lognormal_lens(16, 100, 32768, 7), 8, None, 8192),
    "h2_b16_logu32k": (lognormal_lens(16, 100, 32768, 7), 2, None, 8192),
    "pad16": (lognormal_lens(12, 1000, 8192, 8) + [0] * 4, 8, None, 8192),
    "b8_skew": ([131072] + [1024] * 7, 8, None, 8192),
    "h2_b32_logu32k": (lognormal_lens(32, 100, 32768, 9), 2, None, 8192),
    "h1_b64_logu32k": (lognormal_lens(64, 100, 32768, 10), 1, None, 8192),
    # 5-7 requests over 8 kv heads (40-56 pairs): the split plan (kBalancedMinBatch)
    # gives a pair 4-6 CTAs, fewer than the 8 the rule asks for from 8 requests on
    "b6_skew": ([131072] + [1024] * 5, 8, None, 8192),
    "b6_l8k": ([8192] * 6, 8, None, None),
    "b6_logu16k": (lognormal_lens(6, 100, 16384, 16), 8, None, 8192),
    "b7_logu32k": (lognormal_lens(7, 100, 32768, 17), 8, None, 8192),
    # 9-32 (request, kv head) pairs of 8+ requests (1-4 kv heads): split or balanced
    "h2_b16_skew": ([131072] + [1024] * 15, 2, None, 8192),
    "h1_b32_logu32k": (lognormal_lens(32, 100, 32768, 11), 1, None, 8192),
    "h1_b32_skew": ([131072] + [1024] * 31, 1, None, 8192),
    "h2_pad16": (lognormal_lens(12, 1000, 8192, 12) + [0] * 4, 2, None, 8192),
    "h1_b16_l8k": ([8192] * 16, 1, None, None),
    "h2_b8_logu32k": (lognormal_lens(8, 100, 32768, 14), 2, None, 8192),
    "h4_b8_logu16k": (lognormal_lens(8, 100, 16384, 13), 4, None, 8192),
    # Windows wider than the benchmark's 128 tokens (Mistral / Gemma-style
    # layers), and full attention over the same attended bytes.
    **{f"swa{w}_b{b}_l16k": ([16384] * b, 8, w, None)
       for w in (256, 512, 1024, 2048, 4096) for b in (1, 2, 4, 16, 64)},
    "swa1024_b512_l2k": ([2048] * 512, 8, 1024, None),
    "swa1024_s64_logu16k": (lognormal_lens(64, 16, 16384, 15), 8, 1024, 8192),
    "swa4096_s64_logu16k": (lognormal_lens(64, 16, 16384, 15), 8, 4096, 8192),
    "swa4096_h2_b8_l16k": ([16384] * 8, 2, 4096, None),
    "swa1024_h1_b32_l16k": ([16384] * 32, 1, 1024, None),
    "swa128_b4": ([8192] * 4, 8, 128, None),
    "swa128_b16": ([8192] * 16, 8, 128, None),
    "b4_l4k": ([4096] * 4, 8, None, None),
    "b16_l1k": ([1024] * 16, 8, None, None),
    "b128_50_8k": (lognormal_lens(128, 50, 8192, 3), 8, None, None),
    "swa128_b1": ([8192], 8, 128, None),
    "swa128_b64": ([8192] * 64, 8, 128, None),
    "swa128_pad64": (lognormal_lens(50, 200, 32768, 4) + [0] * 14, 8, 128, 8192),
    "swa128_b256": ([8192] * 256, 8, 128, None),
    "s512": (lognormal_lens(500, 16, 4084, 5) + [0] * 12, 8, None, 8192),
    "swa128_s512": (lognormal_lens(500, 16, 4084, 5) + [0] * 12, 8, 128, 8192),
    "swa128_b128_50_8k": (lognormal_lens(128, 50, 8192, 3), 8, 128, None),
}


def make_sets(lens, kvh, window, width, kv_dtype):
    max_pages = max(-(-n // 16) for n in lens)
    kw = dict(max_blocks=max(width or 0, max_pages + 2), poison=False, kv_dtype=kv_dtype)
    if kv_dtype == FP8:
        kw.update(k_scale=0.01, v_scale=0.01)
    sets, total = [], 0
    while total < 200e6 or len(sets) < 2:
        s = make_paged_inputs(len(lens), lens, kvh, window, "cuda", **kw)
        sets.append(s)
        total += s.kv_cache.numel() * s.kv_cache.element_size()
        if len(sets) >= 64:
            break
    return sets


def kv_bytes(lens, kvh, window, elem):
    att = sum(min(n, window) if window else n for n in lens)
    return att * kvh * 256 * elem


def call_fn(plan, s, window):
    if plan is None:
        return lambda: torch.ops.flint.decode_attention(
            s.q, s.kv_cache, s.block_tables, s.seq_lens, s.sinks, window, SCALE, s.out,
            s.k_scale, s.v_scale)
    return lambda: plans.run_with_plan(plan, s.q, s.kv_cache, s.block_tables, s.seq_lens, s.sinks,
                                       window, SCALE, s.out, s.k_scale, s.v_scale)


def time_plan(plan, sets, window, floor_us):
    fns = [call_fn(plan, s, window) for s in sets]
    s0 = sets[0]
    s0.out.fill_(float("nan"))
    fns[0]()
    torch.cuda.synchronize()
    ref = reference(s0.q, s0.kv_cache, s0.block_tables, s0.seq_lens, s0.sinks, window, SCALE,
                    s0.k_scale, s0.v_scale)
    rep = error_report(s0.out, ref, BF16_VS_F64)
    if not rep.ok(BF16_VS_F64):
        return None, "MISMATCH " + rep.describe(BF16_VS_F64).replace("\n", " | ")
    for f in fns:
        f()
    n = max(len(sets), min(400, int(2000 / max(floor_us, 1.0))))
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(n):
            fns[i % len(fns)]()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n)
    return statistics.median(times), f"err {rep.rel_fro:.1e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument("--plans", default="default,split,balanced",
                    help="which of the default, split, full (window calls: the split "
                    "rules of full attention) and balanced plans (default alone runs on "
                    "an older build's package too: an A/B of builds)")
    ap.add_argument("--variants", action="store_true", help="also every compiled balanced variant")
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--grids", type=lambda x: [int(v) for v in x.split(",") if v], default=[],
                    help="with --variants: balanced grids of this many CTAs too")
    args = ap.parse_args()
    t0 = time.time()
    print("| row | kv | plan | µs | TB/s | note |\n|---|---|---|---|---|---|", flush=True)
    for name in args.rows.split(","):
        lens, kvh, window, width = ROWS[name]
        for kv in args.kv.split(","):
            if time.time() - t0 > args.budget_s:
                print(f"| {name} | {kv} | budget spent | | | |")
                continue
            kv_dtype = FP8 if kv == "fp8" else torch.bfloat16
            sets = make_sets(lens, kvh, window, width, kv_dtype)
            nbytes = kv_bytes(lens, kvh, window, 1 if kv == "fp8" else 2)
            floor_us = nbytes / 4.5e12 * 1e6
            s = sets[0]
            wanted = args.plans.split(",")
            cands = [("default", None)] if "default" in wanted else []
            if "split" in wanted:
                cands.append(("split", plans.split_rules_plan(s.q, s.kv_cache, window)))
            if "full" in wanted and window:  # the full-attention rules, the window kept
                cands.append(("full", plans.split_rules_plan(s.q, s.kv_cache, None)))
            if "balanced" in wanted:
                cands.append(("balanced", plans.balanced_plan(s.kv_cache)))
            if args.variants:
                base = plans.balanced_plan(s.kv_cache)
                cands += [(f"refill {r}", dataclasses.replace(base, refill=r)) for r in (0, 1)]
                # The other compiled balanced variants of this format (ring depths).
                cands += [("variant", v) for v in plans.variants()
                          if v.kind == "balanced" and v.kv == base.kv and v != base]
                # Fewer CTAs than SMs: SMs left to the next call's CTAs.
                cands += [(f"grid {g}", dataclasses.replace(base, ctas=g)) for g in args.grids]
            for label, plan in cands:
                try:
                    us, note = time_plan(plan, sets, window, floor_us)
                except Exception as e:  # noqa: BLE001
                    us, note = None, f"{type(e).__name__}: {str(e)[:200]}"
                    if "CUDA" in str(e) or "illegal" in str(e):
                        print(f"| {name} | {kv} | {label} | FATAL | | {note} |", flush=True)
                        raise
                tbps = f"{nbytes / (us * 1e-6) / 1e12:.2f}" if us else ""
                goal = floor_us / 0.93 + 3
                lab = label if plan is None else f"{label} ({plan.name})"
                print(f"| {name} | {kv} | {lab} | {us:.2f} | {tbps} | goal {goal:.2f}; {note} |"
                      if us else f"| {name} | {kv} | {lab} | - | | {note} |", flush=True)
            del sets
            torch.cuda.empty_cache()
    print(f"quick_ab done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
