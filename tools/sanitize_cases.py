"""Small launches of every kernel path, for compute-sanitizer (memcheck,
racecheck, synccheck): every compiled variant once (its plan from the
extension's own table), the op's default plans, then the balanced kernel's
machinery on purpose --
segments split over warps and CTAs, the two-level merge, chained pieces,
seq_len 0, windows, fp8, PDL off. Results are checked against float64 so that a
run that is silently wrong still fails.

    compute-sanitizer --tool memcheck python tools/sanitize_cases.py [--quick | --defaults]

--quick: the balanced machinery and the op's default plans (racecheck is
slow); --defaults: the op's default plans only, one kernel of each kind per
format; --case I: of those, the I-th only; --kv bf16|fp8: one format only;
--balanced: the balanced machinery only (--balanced-case I: its I-th launch
only, counting from 0 over the formats run); --synccheck-args: the tool
options synccheck needs for each default case, one line per case.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

import torch

from flint_attention.testing import BF16_VS_F64, FP8, assert_close, make_paged_inputs, plans
from flint_attention.testing import reference_decode_attention as reference

SCALE = 0.088


# Each kernel the op picks (launch_plan.cpp), in both formats: 8-warp splits,
# the balanced kernel, the cluster, 9-warp splits, 4-warp splits (full
# attention, then a window), one warp per (request, kv head), 9-warp splits
# past one level of merging, one warp per pair chaining pairs, long windows
# through the full-attention rules: (seq_lens, kv heads, window).
CASES = [([3000, 0, 17], 4, None), ([40] * 12, 2, None), ([900, 5], 2, 128), ([5000], 2, None),
         ([700, 0, 33, 5, 1200, 9], 2, None), ([600, 0, 20, 4000], 2, 32),
         ([(13 * i) % 100 for i in range(200)], 2, 64),
         ([20000], 1, None),  # 9-warp splits merged in two levels (70 splits)
         # one warp per pair past one wave of warps: each warp chains pairs
         # (a pair of >= kStages - 1 pages carries the next one's leading
         # pages: 2 for bf16, 5 for fp8; empty and one-page pairs among them)
         ([0 if i % 5 == 0 else 1 + (37 * i) % 300 for i in range(1100)], 1, 80),
         # windows too long for the short-span kernels: the full-attention
         # split rules (8-warp splits; 9-warp splits in two levels)
         ([5000, 0, 700, 3000], 2, 1024), ([9000], 2, 4096),
         # a kv head's rows in several tiles of 8 (group x query tokens): the
         # split kernels (2 tiles), the balanced kernel (4), short-window
         # splits (2, one partly filled) and one warp per pair (4), with
         # requests shorter than the draft
         ([3000, 0, 17, 2], 2, None, dict(group=12)),
         ([40] * 11 + [3], 2, None, dict(group=8, q_tokens=4)),
         ([900, 5, 2], 2, 128, dict(group=4, q_tokens=3)),
         ([0 if i % 5 == 0 else 1 + (37 * i) % 300 for i in range(300)], 1, 80,
          dict(group=16, q_tokens=2))]

# synccheck's --num-cuda-barriers: 256 (the fp8 9-warp splits keep 36
# mbarriers a CTA, more than the tool tracks by default, which fails their
# launch under it), but the tool's default for these cases, whose 1100
# requests give torch's own set-up and reference kernels grids too large to
# track 256 a CTA (the tool runs out of memory).
SYNCCHECK_DEFAULT_TRACKING = {8}


PICK = int(sys.argv[sys.argv.index("--balanced-case") + 1]) if "--balanced-case" in sys.argv else None
LAUNCHES = itertools.count()  # run()'s calls so far (with --balanced-case: the balanced machinery's)


def check(inp, window, what):
    """inp.out against float64, computed on the CPU: under a sanitizer every
    launch is slow, and the reference launches a few kernels per request
    (on the GPU, 1100 requests kept racecheck past 200 s)."""
    cpu = [None if t is None else t.cpu() for t in (inp.q, inp.kv_cache, inp.block_tables,
                                                    inp.seq_lens, inp.sinks, inp.k_scale,
                                                    inp.v_scale)]
    ref = reference(*cpu[:5], window, SCALE, *cpu[5:])
    assert_close(inp.out.cpu(), ref, BF16_VS_F64, what)


def run(plan, seq_lens, kvh, window):
    if PICK is not None and next(LAUNCHES) != PICK:
        return
    fp8 = dict(kv_dtype=FP8, k_scale=[0.01 + 0.002 * h for h in range(kvh)], v_scale=0.012) \
        if plan.kv == "fp8" else {}
    # Groups below 8 (MMA columns without a query head; the last kv head's
    # q rows and sinks end the tensors) and calls without sinks, with an lse.
    group = (5, 8, 3, 8, 1, 8)[len(seq_lens) % 6]
    sinks = len(seq_lens) % 4 != 1
    inp = make_paged_inputs(len(seq_lens), seq_lens, kvh, window, "cuda", group=group,
                            with_sinks=sinks, with_lse=True, **fp8)
    plans.run_with_plan(plan, inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                        window, SCALE, inp.out, inp.k_scale, inp.v_scale, inp.lse)
    torch.cuda.synchronize()
    what = f"{plan.name} {seq_lens[:8]} kvh={kvh} window={window} group={group} sinks={sinks}"
    check(inp, window, what)
    assert not inp.lse.isnan().any(), f"lse not written: {what}"
    print(f"ok {plan.name} batch={len(seq_lens)} kvh={kvh} window={window} group={group}", flush=True)


def main() -> None:
    if "--synccheck-args" in sys.argv:
        for case in range(len(CASES)):
            print("" if case in SYNCCHECK_DEFAULT_TRACKING else "--num-cuda-barriers 256")
        return
    only = int(sys.argv[sys.argv.index("--case") + 1]) if "--case" in sys.argv else None
    defaults = only is not None or "--defaults" in sys.argv
    balanced_only = "--balanced" in sys.argv or PICK is not None
    quick = defaults or balanced_only or "--quick" in sys.argv
    for plan in [] if quick else plans.variants():
        run(plan, [0, 17, 300, 33, 4097], 2, None)
        run(plan, [700, 129, 0, 5], 2, 64)
    formats = [sys.argv[sys.argv.index("--kv") + 1]] if "--kv" in sys.argv else ["bf16", "fp8"]
    for kv in () if defaults else formats:
        probe = make_paged_inputs(1, [1], 1, None, "cuda", kv_dtype=FP8 if kv == "fp8" else torch.bfloat16)
        plan = plans.balanced_plan(probe.kv_cache)
        ctas = plans._ops().division(probe.q, probe.kv_cache, probe.block_tables, probe.seq_lens,
                                     None, plan.to_ints())[0]
        run(plan, [20000], 1, None)  # one segment over every CTA: the two-level merge
        fewest, cta_pages, cost = plans._ops().division(
            probe.q, probe.kv_cache, probe.block_tables, probe.seq_lens, None, plan.to_ints())[3:]
        # Segments over 25 and 49 CTAs: just past one level with 4 and 8 warps.
        run(plan, [16 * (cta_pages * 24 + 1) - 3], 1, None)
        run(plan, [16 * (cta_pages * 48 + 1) - 3], 1, None)
        run(plan, [(37 * i) % 70 for i in range(300 if not quick else 60)], 8 if not quick else 2,
            48)  # chained short pieces
        run(plan, [0] * 20, 2, None)  # nothing to attend
        # segments ending on CTA boundaries (a segment is its pages + cost units)
        run(plan, [16 * (cta_pages * (ctas // 3) - cost)] * 3, 1, None)
        run(dataclasses.replace(plan, pdl=False), [3000, 1, 0, 260], 2, 128)
    if balanced_only:
        print("sanitize cases done")
        return
    from flint_attention import flint_decode_attention  # the op's own choice of plan

    for kv in formats:
        for lens, kvh, window, *shape in CASES if only is None else CASES[only:only + 1]:
            fp8 = dict(kv_dtype=FP8, k_scale=0.02, v_scale=[0.01 + 0.01 * h for h in range(kvh)]) \
                if kv == "fp8" else {}
            inp = make_paged_inputs(len(lens), lens, kvh, window, "cuda", **fp8, **(shape[0] if shape else {}))
            flint_decode_attention(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                                   window, SCALE, inp.out, k_scale=inp.k_scale, v_scale=inp.v_scale)
            torch.cuda.synchronize()
            check(inp, window, f"default {kv} {lens[:8]}")
            print(f"ok default plan {kv} batch={len(lens)} kvh={kvh} window={window} {shape}", flush=True)
    print("sanitize cases done")


if __name__ == "__main__":
    main()
