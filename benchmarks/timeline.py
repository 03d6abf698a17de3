"""Where a call's time goes, in a chain of calls as a serving engine makes them.

Captures, per benchmark row, one CUDA graph of N back-to-back calls of the
test op flint_testing::decode_attention_timeline (the operator launched
through a variant whose thread 0 of every CTA records %globaltimer and
%clock64 at each phase: csrc/decode_attention/timeline.h), rotating over
input sets larger than L2 like bench_decode.py, replays it, and reports
medians over the calls after the first few:

  period          end of call i-1 -> end of call i (the time per call a chain sees);
                  also its p10 / p90 and mean (the benchmark's per-call time is the
                  mean: at b1_l8k the calls alternate between ~10.4 and ~13 µs)
  late entries    active CTAs that start only after the previous call's end, per
                  call, and their entry -> prologue time against the others'
  first entry     end of call i-1 -> first CTA of call i starts (< 0: PDL overlap)
  wait released   end of call i-1 -> first CTA past griddepcontrol.wait
  per CTA (cycles of its own SM, converted at the SM clock): the time into
  each stamp from the CTA's previous one (entry -> prologue done -> wait
  returned -> pages streamed -> CTA merged -> arrived -> exit), over the CTAs
  that reached it.

"End of call" is the last stamp any CTA of that call wrote (its exit; in the
warp-per-head kernel thread 0 stamps for warp 0's pair only, so on rows with
uneven lengths the end can come out early). The
timeline variants exist for the launch configs the heuristic picks on the
benchmark's short rows (8 warps x 2 stages, 4 x 3, cluster of 8 x 4 warps x 2
stages, one warp per pair with 4 or 8 warps x 2 stages); others are an error.

    python benchmarks/timeline.py --rows b1_l1k,swa128_b16_l8k [--config 8,4,2,1,1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_grid as grid  # noqa: E402
import bench_gpu as G  # noqa: E402

STAMPS = ["entry", "seq_len", "block ids", "prologue", "waited", "streamed", "merged", "arrived",
          "exit"]
# Stamp indices (csrc/decode_attention/timeline.h); "seq_len" and "block ids"
# (loaded, thread 0) only in the split and cluster kernels.
ENTRY, SEQ_LEN, BLOCK_IDS, PROLOGUE, WAITED, STREAMED, MERGED, ARRIVED, EXIT = range(len(STAMPS))


def num_ctas(row: grid.Row, cfg: tuple) -> int:
    pairs = row.batch * row.kv_heads
    return -(-pairs // cfg[1]) if cfg[0] == 0 else pairs * cfg[0]


def run_row(row: grid.Row, cfg: tuple, n_calls: int, skip: int, sm_ghz: float,
            env: dict) -> dict:
    """env: FLINT_* diagnostic variables set, with the config, while the calls
    are captured (the graph keeps the launches chosen then)."""
    op = torch.ops.flint_testing.decode_attention_timeline
    n_sets = grid.num_sets(row, 2 * grid.L2_BYTES_DEFAULT)
    n_calls = max(n_calls, n_sets)  # one rotation over all sets: L2 stays cold
    inp = G.make_inputs(row, n_sets, seed=1, device="cuda")
    ctas = num_ctas(row, cfg)
    timeline = torch.zeros(n_calls, ctas, len(STAMPS), 2, dtype=torch.int64, device="cuda")
    outs = [torch.empty_like(s.q) for s in inp.sets]

    def call(i):
        s = inp.sets[i % n_sets]
        op(s.q, s.kv, s.block_tables, inp.seq_lens, inp.sinks, row.window, grid.SCALE,
           outs[i % n_sets], timeline[i])

    with G.environ({G.FLINT_ENV: grid.format_config(cfg), **env}):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(n_sets):  # eager first calls: workspace, kernel attributes
                call(i)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(n_calls):
                call(i)
    graph.replay()  # warm
    timeline.zero_()
    graph.replay()
    torch.cuda.synchronize()
    t = timeline.cpu().numpy()
    return summarize(row, cfg, t, n_sets, skip, sm_ghz), t


def summarize(row: grid.Row, cfg: tuple, t: np.ndarray, n_sets: int, skip: int,
              sm_ghz: float) -> dict:
    """t: [calls, ctas, stamps, (ns, clock)] int64, 0 where a CTA never got there."""
    written = t[..., 0] != 0
    # %globaltimer counts ns since 1970 (~1.7e18): float64 steps by 256 there,
    # so subtract the earliest stamp in int64 first (clocks likewise).
    ns = np.where(written, t[..., 0] - t[..., 0][written].min(), 0).astype(np.float64)
    clk = np.where(written, t[..., 1] - t[..., 1][written].min(), 0).astype(np.float64)
    n_calls = t.shape[0]

    def med(xs) -> float:
        xs = np.asarray(xs, dtype=np.float64)
        return float(np.median(xs)) if xs.size else float("nan")

    ends = np.where(written, ns, -np.inf).max(axis=(1, 2))
    calls = range(max(skip, 1), n_calls)
    period = [ends[i] - ends[i - 1] for i in calls]

    def after_previous_end(k: int, first: bool) -> list:
        """Per call, the first (or last) CTA's stamp k after the previous call's end."""
        pick = np.min if first else np.max
        return [pick(ns[i, written[i, :, k], k]) - ends[i - 1] for i in calls
                if written[i, :, k].any()]

    # Per call, the active CTAs (those past their prologue) that entered only
    # after the previous call's end, and their prologues against the others':
    # late entries start their loads while the earlier CTAs stream, and the
    # calls alternate between fast and slow ones (run 29).
    # Their prologue in parts too: entry -> seq_len loaded -> block ids loaded
    # -> leading pages issued (split and cluster kernels).
    late_n, late_prologue, early_prologue = [], [], []
    parts = {"late": {k: [] for k in (SEQ_LEN, BLOCK_IDS, PROLOGUE)},
             "others": {k: [] for k in (SEQ_LEN, BLOCK_IDS, PROLOGUE)}}
    for i in calls:
        active = written[i, :, PROLOGUE]
        late = active & (ns[i, :, ENTRY] > ends[i - 1])
        prologue = ns[i, :, PROLOGUE] - ns[i, :, ENTRY]
        late_n.append(int(late.sum()))
        late_prologue.extend(prologue[late])
        early_prologue.extend(prologue[active & ~late])
        for group, sel in (("late", late), ("others", active & ~late)):
            sel = sel & written[i, :, SEQ_LEN] & written[i, :, BLOCK_IDS]
            for k in (SEQ_LEN, BLOCK_IDS, PROLOGUE):
                parts[group][k].extend(ns[i, sel, k] - ns[i, sel, k - 1])

    first_entry = after_previous_end(ENTRY, first=True)
    released = after_previous_end(WAITED, first=True)
    # Per CTA, the phase ending at stamp k starts at the latest earlier stamp
    # that CTA wrote (a cluster CTA has no "arrived", a warp-per-head one no
    # "merged"); SM cycles, converted at sm_ghz.
    phases = {}
    w, c = written[skip:], clk[skip:]
    for k in range(1, len(STAMPS)):
        start = np.full(w.shape[:2], np.nan)
        for j in range(k):
            start = np.where(w[..., j], c[..., j], start)
        ok = w[..., k] & ~np.isnan(start)
        phases[f"to {STAMPS[k]}"] = med((c[..., k] - start)[ok] / sm_ghz / 1e3)
    # The chain of one call, from the previous call's end: the last CTA past
    # the wait, done streaming, merged, arrived, and the end; plus the final
    # merge of the CTA that ended the call (its arrived -> exit).
    chain = {name: med(after_previous_end(k, first=False)) / 1e3
             for k, name in ((WAITED, "last waited"), (STREAMED, "last streamed"),
                             (MERGED, "last merged"), (ARRIVED, "last arrived"))}
    chain["end"] = med(period) / 1e3
    last_merge = []
    for i in calls:
        cta = int(np.argmax(np.where(written[i, :, EXIT], ns[i, :, EXIT], -np.inf)))
        if written[i, cta, ARRIVED]:
            last_merge.append(ns[i, cta, EXIT] - ns[i, cta, ARRIVED])
    chain["final merge"] = med(last_merge) / 1e3
    # Split and cluster kernels: the CTAs of (request, kv head) j are j * splits
    # + 0 .. splits - 1 in launch order. Per pair, its CTAs' median entry and
    # its end (last exit), after the previous call's end: pairs launched last
    # enter last, when the previous call frees its SMs.
    pairs = []
    if cfg[0] > 0 and t.shape[1] % cfg[0] == 0:
        for j in range(t.shape[1] // cfg[0]):
            ctas = slice(j * cfg[0], (j + 1) * cfg[0])
            entry, end = [], []
            for i in calls:
                active = written[i, ctas, PROLOGUE]  # idle splits never get there
                if active.any():
                    entry.append(med(ns[i, ctas, ENTRY][active]) - ends[i - 1])
                    end.append(ns[i, ctas, EXIT][written[i, ctas, EXIT]].max() - ends[i - 1])
            pairs.append({"entry_us": med(entry) / 1e3, "end_us": med(end) / 1e3})
    steps = np.diff(np.sort(np.unique(ns[written])))
    return {
        "row": row.name, "config": grid.format_config(cfg), "ctas": int(t.shape[1]),
        "calls": n_calls, "sets": n_sets, "period_us": med(period) / 1e3,
        # The benchmark's time per call follows the mean, not the median.
        "period_mean_us": float(np.mean(period)) / 1e3 if period else float("nan"),
        "period_p10_p90_us": [float(np.percentile(period, q)) / 1e3 if period else float("nan")
                              for q in (10, 90)],
        "late_entries": {"per_call": float(np.mean(late_n)) if late_n else float("nan"),
                         "prologue_us": med(late_prologue) / 1e3,
                         "prologue_p90_us": (float(np.percentile(late_prologue, 90)) / 1e3
                                             if late_prologue else float("nan")),
                         "others_prologue_us": med(early_prologue) / 1e3,
                         # medians of entry -> seq_len, -> block ids, -> prologue
                         "parts_us": {g: [med(parts[g][k]) / 1e3 for k in (SEQ_LEN, BLOCK_IDS,
                                                                              PROLOGUE)]
                                      for g in parts}},
        "first_entry_us": med(first_entry) / 1e3, "wait_released_us": med(released) / 1e3,
        "cta_phase_us": phases, "chain_us": chain, "pairs": pairs,
        "ctas_reaching": {s: int(w[..., k].sum()) for k, s in enumerate(STAMPS)},
        "globaltimer_step_ns": float(steps[steps > 0].min()) if (steps > 0).any() else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", default="b1_l1k,b1_l8k,h1_b8_l8k,swa128_b1_l8k,swa128_b16_l8k,"
                                     "swa128_b64_l8k,swa128_b256_l8k")
    p.add_argument("--config", help="FLINT_LAUNCH_CONFIG for every row (default: the heuristic's)")
    p.add_argument("--calls", type=int, default=64, help="calls per graph (at least one per input set)")
    p.add_argument("--skip", type=int, default=8, help="leading calls left out of the medians")
    p.add_argument("--sm-ghz", type=float, default=1.98, help="SM clock for cycles -> ns")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--raw", help="also write every row's stamps here (.npz, [calls, ctas, stamps, ns|clock])")
    p.add_argument("--from-raw", help="summarize the stamps a --raw file holds (no GPU needed; "
                                      "the config is --config or the heuristic's at --sms)")
    p.add_argument("--sms", type=int, default=132, help="with --from-raw: the GPU's SM count")
    p.add_argument("--env", action="append", default=[], metavar="FLINT_VAR=VALUE[+...]",
                   help="also run every row with these diagnostic variables set (repeatable)")
    args = p.parse_args()
    envs = [grid.parse_env(e) for e in args.env]
    if None in envs:
        p.error("--env takes FLINT_VAR=VALUE[+FLINT_VAR=VALUE...]")
    envs = [{}] + envs
    saved = np.load(args.from_raw) if args.from_raw else None
    if saved is None:
        G.import_flint()
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        runs = [(r, e, r.name + "".join(f"[{k}={v}]" for k, v in e.items()))
                for r in grid.select_rows(args.rows, False) for e in envs]
    else:  # saved keys: row names, with [FLINT_VAR=VALUE] for --env runs
        sms = args.sms
        runs = [(grid.select_rows(k.split("[")[0], False)[0], {}, k) for k in saved.files]
    results, raw = [], {}
    for row, env, key in runs:
        cfg = (grid.parse_config(args.config) if args.config
               else grid.row_launch_config(row, sms))
        if saved is None:
            r, raw[key] = run_row(row, cfg, args.calls, args.skip, args.sm_ghz, env)
        else:
            r = summarize(row, cfg, saved[key], 0, args.skip, args.sm_ghz)
        r["row"] = key
        results.append(r)
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r["cta_phase_us"].items())
        print(f"{r['row']} [{r['config']}, {r['ctas']} CTAs]: period {r['period_us']:.2f} µs, "
              f"first entry {r['first_entry_us']:+.2f}, wait released {r['wait_released_us']:+.2f} "
              f"(vs previous call's end); per CTA (µs): {phases}; CTAs reaching: "
              f"{r['ctas_reaching']}; globaltimer step {r['globaltimer_step_ns']} ns", flush=True)
        p10, p90 = r["period_p10_p90_us"]
        late = r["late_entries"]
        print(f"  periods p10 / median / p90 {p10:.2f} / {r['period_us']:.2f} / {p90:.2f}, mean "
              f"{r['period_mean_us']:.2f} µs; active CTAs entering after the previous call's "
              f"end: {late['per_call']:.1f} per call, prologue median {late['prologue_us']:.2f} "
              f"(p90 {late['prologue_p90_us']:.2f}) against {late['others_prologue_us']:.2f} for "
              f"the others", flush=True)
        if not np.isnan(late["parts_us"]["others"][0]):
            lp, op = late["parts_us"]["late"], late["parts_us"]["others"]
            print(f"  prologue parts (entry -> seq_len -> block ids -> pages issued), late "
                  f"entries {lp[0]:.2f} / {lp[1]:.2f} / {lp[2]:.2f}, the others {op[0]:.2f} / "
                  f"{op[1]:.2f} / {op[2]:.2f} µs", flush=True)
        chain = ", ".join(f"{k} {v:+.2f}" for k, v in r["chain_us"].items())
        print(f"  chain (µs after the previous call's end): released {r['wait_released_us']:+.2f}, "
              f"{chain}", flush=True)
        if 0 < len(r["pairs"]) <= 16:
            spread = ", ".join(f"{q['entry_us']:+.2f}/{q['end_us']:+.2f}" for q in r["pairs"])
            print(f"  per (request, kv head) in launch order, median entry/end (µs after the "
                  f"previous call's end): {spread}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.raw:
        np.savez_compressed(args.raw, **raw)


if __name__ == "__main__":
    main()
