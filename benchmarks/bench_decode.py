"""Benchmark of Flint's paged decode attention against the HBM read ceiling and
its peers, all measured in the same run on identical inputs.

Rows (bench_grid.py; --list-rows prints each one's lengths and shape)
    The core rows (G 8 query heads per kv head, head_dim 128, sinks; run by
    default): 15 uniform rows (the group "legacy") and serving-shaped rows
    (the group "serving"): ragged
    lengths from fixed-seed distributions (log-uniform, one long among many
    short, bimodal, nearly uniform), batches padded with seq_len-0 rows to
    CUDA-graph capture sizes, block tables 8192 wide, each request's blocks
    drawn at random from one KV pool of tens of GB, 1-2 kv heads at 32k-128k,
    sliding-window layers at the same batch shapes. The group "models"
    (--rows models): served models' shapes -- gpt-oss-120b (G 8, D 64, sinks,
    and its 128-token window layers), Llama-3.1-8B (G 4), Qwen3-235B at TP4
    (G 16, 1 kv head), GLM-4.5 (G 12), MiniMax-M2 (G 6), Qwen3.5 (G 8, D 256,
    2 kv heads), no sinks but gpt-oss's -- each in uniform b1, b8 and b32 rows
    and one serving-shaped row. The group "spec" (--rows spec): speculative
    decoding, Q = 2, 4 and 8 query tokens per request (<row>_q<Q>, q and out
    [B, Q, H, D], token i at position seq_len - Q + i, causal) on b1_l8k,
    b32_l1k, srv_s24_r20_1k8k, swa128_b16_l8k and h1_b8_l8k. Every row has an fp8 twin
    (<name>_fp8): the same lengths, tables and queries on an e4m3 cache
    holding the same values quantized (per-tensor scales, dequantized =
    stored x scale).

What is timed
    One query token per request (the spec rows: Q), the row's G and head_dim D, HND cache
    [num_blocks, kv_heads, 16, 2 D] (K in [..., :D], V in [..., D:]), fp32
    sinks or none, scale D**-0.5. Each row rotates over enough input sets (block
    placements with their own q and out) that one rotation touches >= 3 x L2:
    consecutive calls never find their K/V in L2. Per implementation: one eager
    call on set 0 checked against the float64 reference of
    flint_attention.testing (the first, last, longest and shortest requests
    and a padding row, gathering only their pages) -- a mismatch is reported,
    never timed (rows of Q > 1 query tokens: also a short-request probe of the
    same shape, bench_gpu.draft_probe, where a wrong mask within the draft
    shows); then one CUDA graph of N back-to-back calls rotating over the
    sets (N ~ 5 ms of work at the floor, at least 8 and every set once), 3
    warm-up replays, the median of 20 timed replays; µs per call = replay / N.

Floors and goals
    KV bytes = attended K+V bytes (positions x kv heads x 2 D x 2 bytes bf16 /
    1 byte fp8; with Q query tokens the union of their spans, read once: W + Q
    - 1 positions with a window W). floor = KV bytes / the ceiling measured in this run (the best
    of a few plain streaming reads of a 4 GiB buffer); % ceil = (KV bytes /
    time) / ceiling. goal = KV bytes at 4.5 TB/s / 0.93 + 3 µs, stretch = /
    0.95 + 2 µs (a fixed bandwidth: goals do not move with the machine). balance = the slowest CTA's pages / the mean,
    from flint's default launch plan (flint_attention.testing.plans).

Implementations (--impls; one that cannot run is reported missing with its
exception, never estimated; Flint on a shape its build does not serve:
missing, "not served: <the error's first line>")
    flint          the public op
    flint-split    the split kernels' plan for the row (plans.split_rules_plan), through
                   the test-only extension, forced on every row (an A/B): what the
                   op launches for sliding windows and for full attention below 8
                   requests or while the split grid gives a pair >= 8 CTAs
    flint-balanced the balanced kernel's plan (plans.balanced_plan), forced on
                   every row: what the op launches for the other full-attention calls
    vllm-triton    vLLM's Triton unified attention (.peers/vllm_triton, peers/README.md),
                   on views of the same cache, sinks, window, fp8 descales; Q > 1:
                   cu_seqlens_q = arange(B + 1) * Q, max_seqlen_q = Q
    xqa            FlashInfer trtllm_batch_decode_with_kv_cache(backend="xqa"), HND
                   views, sinks, window_left = W - 1, fp8 scales (peer_xqa.py); Q > 1:
                   q_len_per_req = Q with a causal draft mask
    sdpa           torch SDPA on a dense copy, no sinks (uniform bf16 rows of one
                   query token only)

Robustness
    The run is a supervisor and a worker process. The worker measures and
    rewrites the JSON after every step; a CUDA error that breaks its context, a
    crash, or a call hung past --impl-timeout-s ends it, and the supervisor
    starts a new worker that resumes from the JSON with that implementation
    skipped on rows of the same kind (dtype, window, padding), reported with the
    error. --budget-s bounds the whole run (rows not reached are reported
    skipped), --row-budget-s one row.

Outputs
    Progress lines on stderr; at the end the compact table (row, Flint µs,
    TB/s, % of ceiling, goal, met?, balance, split, XQA, vLLM-triton, fp8/bf16),
    the full table, a results block (machine, versions, commit, method, tables),
    JSON (default benchmarks/out/bench_<timestamp>.json, git-ignored) and a PNG
    (bench_report.py --plot re-renders one from a JSON).

Usage (GPU)
    python benchmarks/bench_decode.py --out-dir $OUT                 # the core rows
    python benchmarks/bench_decode.py --rows models --out-dir $OUT   # the models' rows
    python benchmarks/bench_decode.py --rows spec --impls flint,vllm-triton,xqa --budget-s 420 --out-dir $OUT
    python benchmarks/bench_decode.py --rows legacy --kv-dtypes bf16 --impls flint,xqa
    python benchmarks/bench_decode.py --rows 'srv_*,b1_l8k_fp8' --budget-s 120
Without a GPU: --dry-run prints every row, its bytes, floors and an estimate of
the run time, checks the peers' argument mapping on the CPU and exercises the
reporting on fake timings; --list-rows lists the rows and their lengths.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Where a run's JSON and PNG go unless --out-dir says otherwise (git-ignored).
OUT_DIR = HERE / "out"
# The vLLM peer's command line (compile-ahead and CPU check processes).
PEER_VLLM = HERE / "peers" / "peer_vllm.py"
if __package__ in (None, ""):  # run as a file: the repository's packages import as under `python -m`
    sys.path.insert(0, str(REPO))
if __name__ == "__main__":
    from benchmarks import checkout

    checkout.use_this_checkout()

from benchmarks import bench_grid as grid  # noqa: E402
from benchmarks import bench_report as report  # noqa: E402

# --impls key -> the name in tables and JSON; aliases.
IMPLS = {"flint": "flint", "flint-split": "flint-split", "flint-balanced": "flint-balanced",
         "vllm-triton": "vllm-triton",
         "xqa": "fi-xqa", "sdpa": "sdpa"}
ALIASES = {"split": "flint-split", "balanced": "flint-balanced", "vllm": "vllm-triton", "fi-xqa": "xqa"}
DEFAULT_IMPLS = "flint,flint-split,flint-balanced,vllm-triton,xqa,sdpa"  # vllm before xqa: its Triton JIT
# overlaps FlashInfer's prebuild


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_FATAL = grid.FATAL_ERROR


def is_fatal(e: BaseException) -> bool:
    """A CUDA error that leaves the context unusable: nothing after it can run."""
    return bool(_FATAL.search(str(e)))


def oneline(msg: str, limit: int = 2000) -> str:
    return " | ".join(line.strip() for line in msg.strip().splitlines() if line.strip())[:limit]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Flint paged decode attention benchmark (see the module docstring for the method).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sel = p.add_argument_group("rows")
    sel.add_argument("--rows", help="comma-separated row names, shell patterns (srv_*), groups "
                     "(legacy, serving, core, models, spec, all; default: core), <name>_fp8 for a twin "
                     "alone, custom:B,kvH,L[,W[,G,D[,S[,Q]]]] (';'-separated when several)")
    sel.add_argument("--quick", action="store_true", help=f"only {', '.join(grid.QUICK_ROWS)}")
    sel.add_argument("--kv-dtypes", default="bf16,fp8", help="twins to run: bf16, fp8 or both")
    sel.add_argument("--list-rows", action="store_true", help="list the rows and their lengths, and exit")
    imp = p.add_argument_group("implementations")
    imp.add_argument("--impls", default=DEFAULT_IMPLS, help=f"comma-separated subset of {','.join(IMPLS)}")
    imp.add_argument("--eager", action="store_true", help="also time eager loops (launch overhead)")
    imp.add_argument("--no-prebuild", action="store_true",
                     help="build FlashInfer's XQA modules at their first call, one at a time")
    t = p.add_argument_group("timing")
    t.add_argument("--reps", type=int, default=20, help="timed graph replays (median)")
    t.add_argument("--warmup", type=int, default=3, help="warm-up replays")
    t.add_argument("--eager-reps", type=int, default=5, help="timed eager loops (median)")
    t.add_argument("--target-us", type=float, default=5000.0,
                   help="work per replay at the floor, sets the calls per graph")
    t.add_argument("--min-calls", type=int, default=8, help="min calls per graph")
    t.add_argument("--max-calls", type=int, default=1000,
                   help="max calls per graph (raised to one call per set if needed)")
    t.add_argument("--l2-multiple", type=float, default=3.0,
                   help="rotated input bytes >= this x L2 (and >= 180 MB)")
    t.add_argument("--ceiling", type=float, help="HBM ceiling in TB/s: skip measuring it")
    t.add_argument("--ceiling-gib", type=float, default=4.0, help="buffer size of the ceiling reads")
    t.add_argument("--pool-gib", type=float, default=24.0,
                   help="the serving rows' bf16 KV pool (its fp8 twin is half of it)")
    b = p.add_argument_group("budget and robustness")
    b.add_argument("--budget-s", type=float, default=330.0,
                   help="the whole run; rows not reached by then are reported skipped")
    b.add_argument("--row-budget-s", type=float, default=60.0,
                   help="one row (FlashInfer's prebuild wait not counted): its remaining "
                        "implementations are skipped past it")
    b.add_argument("--impl-timeout-s", type=float, default=30.0,
                   help="one implementation's graph capture and replays; past it the worker is "
                        "restarted and the implementation skipped on rows of that kind")
    b.add_argument("--first-call-timeout-s", type=float, default=180.0,
                   help="likewise, its first call and check (Triton's JIT included)")
    b.add_argument("--setup-timeout-s", type=float, default=300.0,
                   help="likewise, its setup (waiting for FlashInfer's build included)")
    b.add_argument("--max-restarts", type=int, default=3, help="worker restarts after a crash or hang")
    b.add_argument("--jit-warmers", type=int, default=3,
                   help="processes compiling vLLM's Triton kernels for the selected rows ahead of the "
                        "worker (into Triton's disk cache, no GPU work); 0: none")
    b.add_argument("--no-supervisor", action="store_true", help="measure in this process (no restarts)")
    c = p.add_argument_group("checking")
    c.add_argument("--no-check", action="store_true", help="time without checking outputs")
    c.add_argument("--seed", type=int, default=0)
    o = p.add_argument_group("output")
    o.add_argument("--out-dir", default=str(OUT_DIR), help="JSON and PNG go here (default benchmarks/out/)")
    o.add_argument("--json", help="JSON path (default <out-dir>/bench_<timestamp>.json)")
    o.add_argument("--no-plot", action="store_true")
    o.add_argument("--dry-run", action="store_true",
                   help="no GPU: print the rows, check the peers' mapping on the CPU, fake timings")
    o.add_argument("--sms", type=int, default=grid.SMS_DEFAULT, help="SM count assumed by --dry-run")
    # --device cpu: the whole run's plumbing (supervisor, worker, JSON, report)
    # on the CPU path with wall-clock timing, for the tests; needs --ceiling.
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help=argparse.SUPPRESS)
    p.add_argument("--rotation-mb", type=float, help=argparse.SUPPRESS)  # tests: a smaller rotation
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.kv_dtype_list = [d.strip() for d in args.kv_dtypes.split(",") if d.strip()]
    bad = [d for d in args.kv_dtype_list if d not in grid.KV_DTYPES]
    if bad or not args.kv_dtype_list:
        p.error(f"--kv-dtypes takes {', '.join(grid.KV_DTYPES)}, got {args.kv_dtypes!r}")
    try:
        args.row_list = grid.select_rows(args.rows, args.quick, args.kv_dtype_list)
    except ValueError as e:
        p.error(str(e))
    keys = [ALIASES.get(s.strip(), s.strip()) for s in args.impls.split(",") if s.strip()]
    bad = [k for k in keys if k not in IMPLS]
    if bad:
        p.error(f"unknown implementation(s) {bad}; choose from {', '.join(IMPLS)}")
    args.impl_list = list(dict.fromkeys(keys))
    if args.reps < 1:
        p.error("--reps must be >= 1")
    return args


def target_bytes(args, l2_bytes: int) -> int:
    if args.rotation_mb:
        return int(args.rotation_mb * 1e6)
    return int(max(3 * grid.L2_BYTES_DEFAULT, args.l2_multiple * l2_bytes))


def git_commit() -> str | None:
    if os.environ.get("FLINT_GIT_COMMIT"):
        return os.environ["FLINT_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def method(args, target: int) -> str:
    return (f"CUDA graph of N back-to-back calls rotating over input sets totalling "
            f">= {target / 1e6:.0f} MB (L2 cold), {args.warmup} warm-up replays, median of "
            f"{args.reps} replays, µs per call = replay / N; outputs checked against float64 "
            f"(flint_attention.testing) before timing; serving rows on a {args.pool_gib:g} GiB "
            f"bf16 pool (fp8 twin {args.pool_gib / 2:g} GiB)")


def sets_of(row: grid.Row, rows: list[grid.Row], target: int) -> dict[str, int]:
    """Input sets per dtype for the bf16 row ``row`` and its twins in ``rows``."""
    return {r.kv_dtype: grid.num_sets(r, target) for r in rows if r.twin == row.name}


def base_rows(rows: list[grid.Row]) -> list[grid.Row]:
    """The bf16 rows behind ``rows`` (twins share one set of inputs), in order."""
    out, seen = [], set()
    for r in rows:
        if r.twin not in seen:
            seen.add(r.twin)
            out.append(r.as_dtype("bf16"))
    return out


def base_result(row: grid.Row, ceiling_tbps: float, n_sets: int, n_calls: int) -> dict:
    s = row.summary
    return {
        "row": row.name, "kv_dtype": row.kv_dtype, "twin": row.twin, "group": row.group,
        "batch": row.batch, "kv_heads": row.kv_heads, "gqa": row.gqa, "head_dim": row.head_dim,
        "sinks": row.sinks, "q_tokens": row.q_tokens, "model": row.model, "seq_len": row.seq_len, "window": row.window,
        "table_width": row.width, "placement": row.placement, "spec": row.spec,
        "lengths": {"count": s.count, "padding": s.padding, "min": s.min, "median": s.median,
                    "max": s.max, "attended_tokens": s.attended_tokens, "attended_pages": s.attended_pages},
        "kv_bytes": row.kv_bytes, "qo_bytes": row.qo_bytes, "set_bytes": row.set_bytes,
        "floor_us": row.floor_us(ceiling_tbps), "goal_us": row.goal_us(), "stretch_us": row.stretch_us(),
        "goal_ceiling_us": report.goal_us(row.kv_bytes, report.GOAL, ceiling_tbps),
        "n_sets": n_sets, "n_calls": n_calls, "balance": {}, "impls": {},
    }


def row_dicts(rows: list[grid.Row]) -> list[dict]:
    return [base_result(r, report.GOAL_TBPS, 0, 0) for r in rows]


def est_seconds(row: grid.Row, n_calls: int, args, impls: int) -> float:
    """Rough GPU seconds of one row: replays of every implementation at ~1.3x
    the floor (3 µs at least a call), plus ~0.4 s of setup, check and capture each."""
    per_call = max(row.floor_us(4.5) * 1.3, 3.0) * 1e-6
    return impls * (n_calls * per_call * (args.warmup + args.reps + 1) + 0.4)


def impl_class(name: str, row: grid.Row) -> list:
    """Rows on which a fatal error of implementation ``name`` is expected to
    recur: same implementation, kv dtype, window or not, padding or not, and
    shape (G, D, sinks, query tokens per request)."""
    return [name, row.kv_dtype, row.window is not None, row.summary.padding > 0, row.gqa, row.head_dim,
            row.sinks, row.q_tokens]


def test_fault(row: str, impl: str) -> None:
    """FLINT_BENCH_TEST_FAULT=crash:<row>:<impl> or hang:<row>:<impl> makes the
    worker die or hang there (once per JSON: the supervisor's recovery is
    tested on the CPU with it)."""
    spec = os.environ.get("FLINT_BENCH_TEST_FAULT", "")
    kind, _, where = spec.partition(":")
    if where == f"{row}:{impl}":
        if kind == "crash":
            os._exit(9)
        if kind == "hang":
            time.sleep(3600)


def emit(text: str = "") -> None:
    print(text, flush=True)


def final_report(args, meta, ceiling, results, json_path: Path, png_path: Path) -> None:
    """The block for RESULTS.md (with the full table) first, then the compact
    table, the summary and where the files are: the tail of the output is
    what a reader sees first."""
    report.annotate(results)
    report.write_json(json_path, meta, ceiling, results)
    png_line = ""
    if not args.no_plot:
        try:
            png_line = report.plot(png_path, ceiling, results)
        except Exception as e:  # noqa: BLE001 (a plot failure must not lose the results)
            png_line = f"plot failed: {type(e).__name__}: {e}"
    emit("----- results (benchmarks/RESULTS.md's form) -----")
    emit(report.results_block(meta, ceiling, results))
    emit("----- end -----")
    et = report.eager_table(results)
    if et:
        emit("\nEager loops vs graph replay (µs per call):\n")
        emit(et)
    emit()
    emit(report.ceiling_line(ceiling))
    emit()
    emit(report.compact_table(results))
    emit()
    for line in report.summary_lines(results):
        emit(line)
    for m in meta.get("failed_rows", []):
        emit(f"- row failed: {m}")
    for m in meta.get("skipped", []):
        emit(f"- {m}")
    for m in meta.get("restarts", []):
        emit(f"- worker restarted: {m}")
    emit(f"\njson: {json_path}")
    if png_line:
        emit(png_line)


def paths(args, stamp: str, out_dir: Path) -> tuple[Path, Path]:
    json_path = Path(args.json) if args.json else out_dir / f"bench_{stamp}.json"
    return json_path, json_path.with_suffix(".png")


# --- rows and dry run ---------------------------------------------------------------------


def list_rows(args) -> int:
    rows = args.row_list
    emit(report.lengths_table(row_dicts(base_rows(rows))))
    emit(f"\n{len(rows)} rows ({', '.join(args.kv_dtype_list)} twins of the {len(base_rows(rows))} "
         f"above, same lengths); quick: {', '.join(grid.QUICK_ROWS)}")
    return 0


def plan_rows(args, ceiling_tbps: float, l2: int) -> tuple[list[dict], float]:
    """Per row: sets, calls and estimated seconds; and their total."""
    target = target_bytes(args, l2)
    n_impls = len(args.impl_list)
    out, total = [], 0.0
    for r in args.row_list:
        n = grid.num_sets(r, target)
        calls = grid.num_calls(r, n, ceiling_tbps, args.target_us, args.min_calls, args.max_calls)
        k = n_impls - (1 if "sdpa" in args.impl_list and (r.kv_dtype != "bf16" or r.lengths or r.q_tokens > 1)
                       else 0)
        est = est_seconds(r, calls, args, k)
        total += est
        out.append({"row": r, "sets": n, "calls": calls, "est_s": est})
    return out, total


def dry_run(args) -> int:
    from benchmarks import bench_gpu as G

    ceiling_tbps = args.ceiling or 4.8
    l2 = grid.L2_BYTES_DEFAULT
    target = target_bytes(args, l2)
    emit(f"dry run: no GPU touched; assumed ceiling {ceiling_tbps} TB/s, {args.sms} SMs, "
         f"L2 {l2 / 1e6:.0f} MB, rotation target {target / 1e6:.0f} MB, pool {args.pool_gib:g} GiB\n")
    planned, total = plan_rows(args, ceiling_tbps, l2)
    head = ["row", "lengths", "KV MB", "floor µs", "goal µs", "sets", "calls", "est s"]
    emit("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for p in planned:
        r = p["row"]
        emit(f"| {r.name} | {r.summary.describe()} | {r.kv_bytes / 1e6:.1f} | "
             f"{r.floor_us(ceiling_tbps):.2f} | {r.goal_us():.2f} | {p['sets']} | {p['calls']} | "
             f"{p['est_s']:.1f} |")
    n_xqa = len({G.xqa_variant(r) for r in args.row_list}) if "xqa" in args.impl_list else 0
    emit(f"\nestimated GPU time: {total:.0f} s of measurements for {len(planned)} rows x "
         f"{len(args.impl_list)} implementations, plus the ceiling (~3 s), the pool fill (~1 s), "
         f"FlashInfer's XQA builds ({n_xqa} modules in one ninja run, ~20-40 s per 4, overlapped with "
         f"the first rows) and Triton's JIT "
         f"(a few s per kernel variant, {args.jit_warmers} processes compiling ahead); "
         f"--budget-s {args.budget_s:g}\n")

    emit("CPU checks:")
    # 1. every row's block tables at full size, against the real pool's block count
    t0 = time.time()
    pool_bytes = int(args.pool_gib * 2**30) // (8 * 16 * 256 * 2) * (8 * 16 * 256 * 2)
    for r in args.row_list:
        if r.kv_dtype != "bf16" and r.twin in {x.name for x in args.row_list}:
            continue
        n = max(grid.num_sets(r.as_dtype(d), target) for d in args.kv_dtype_list) \
            if r.kv_dtype == "bf16" else grid.num_sets(r, target)
        blocks = pool_bytes // r.as_dtype("bf16").block_bytes if r.placement == "pool" \
            else n * r.attended_blocks
        G.draw_tables(r, blocks, n, args.seed)
    emit(f"- block tables of every row drawn at full size ({time.time() - t0:.1f} s): ok")
    # 2. the plans
    try:
        plans = G.import_plans()
        emit(f"- plans: importable ({plans.__name__})")
    except G.Unavailable as e:
        emit(f"- {e}: flint-split and flint-balanced will be reported missing and the balance column n/a")
    # 3. the peers' call mapping
    for line in peer_cpu_checks(args):
        emit(f"- {line}")
    # Fake timings exercise the reporting end to end.
    results = []
    for i, p in enumerate(planned):
        row = p["row"]
        res = base_result(row, ceiling_tbps, p["sets"], p["calls"])
        fl = row.floor_us(ceiling_tbps)
        res["balance"]["flint"] = {"plan": "FAKE", "max_pages": 10, "mean_pages": 9.0, "ratio": 10 / 9}
        res["impls"]["flint"] = {"status": "ok", "us": fl * 1.05 + 2.0, "err": 2e-3}
        res["impls"]["flint-split"] = {"status": "missing", "reason": "FAKE: plans unavailable"}
        res["impls"]["vllm-triton"] = {"status": "ok", "us": fl * 1.6 + 6, "note": "FAKE vllm"}
        res["impls"]["fi-xqa"] = {"status": "ok", "us": fl * 1.3 + 5, "note": "FAKE flashinfer"}
        if row.group == "legacy" and row.kv_dtype == "bf16":
            res["impls"]["sdpa"] = ({"status": "missing", "reason": "FAKE: RuntimeError: no kernel"}
                                    if i == 0 else {"status": "ok", "us": fl * 1.1 + 4})
        report.fill_rates(res, ceiling_tbps)
        results.append(res)
    meta = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": "DRY RUN (fake timings)", "torch": "n/a", "cuda": "n/a", "flashinfer": None,
            "commit": git_commit(), "method": method(args, target), "dry_run": True,
            "skipped": ["FAKE: 0 rows skipped (budget)"]}
    ceiling = {"tbps": ceiling_tbps, "kernel": "assumed", "bytes": 0}
    out_dir = Path(args.out_dir) if args.out_dir != str(OUT_DIR) else Path(
        tempfile.mkdtemp(prefix="flint-bench-dry-"))
    json_path, png_path = paths(args, "dryrun", out_dir)
    final_report(args, meta, ceiling, results, json_path, png_path)
    # The saved JSON renders again without a GPU.
    _, c2, r2 = report.load_json(json_path)
    assert len(r2) == len(results) and c2["tbps"] == ceiling_tbps
    return 0


def peer_cpu_checks(args) -> list[str]:
    """What can be verified of the peers without a GPU."""
    from benchmarks.peers import peer_vllm, peer_xqa

    out = []
    if "vllm-triton" in args.impl_list:
        try:
            m = peer_vllm.load()
            out.append(f"vllm-triton: {peer_vllm.PEER_DIR} imports under stubs "
                       f"(vllm {peer_vllm.source_info().get('vllm_version', '?')}, {m.__name__})")
            cmd = [sys.executable, str(PEER_VLLM), "--cpu-check"]
            env = dict(os.environ, TRITON_INTERPRET="1")
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
            if done.returncode == 0:
                out += [f"vllm-triton under Triton's CPU interpreter: {ln}" for ln in lines]
            else:
                out.append(f"vllm-triton CPU run FAILED (rc {done.returncode}): "
                           f"{oneline(done.stdout + done.stderr, 1500)}")
            out.append(vllm_compile_check(args))
        except peer_vllm.PeerUnavailable as e:
            out.append(f"vllm-triton: missing here ({e})")
        except subprocess.TimeoutExpired:
            out.append("vllm-triton CPU check: timed out")
    if "xqa" in args.impl_list:
        out.append(peer_xqa.cpu_check())
    return out


def vllm_specs(rows: list[grid.Row]) -> list[dict]:
    """The distinct call shapes of ``rows`` for vLLM's kernels (and of the
    draft probes of rows of Q > 1 query tokens: bench_gpu.draft_probe)."""
    from benchmarks.peers import peer_vllm

    specs = []
    for r in rows:
        s = peer_vllm.warm_spec(r.batch, r.kv_heads, r.window, r.kv_dtype, r.width, r.gqa, r.head_dim,
                                r.sinks, r.q_tokens)
        todo = [s]
        if r.q_tokens > 1:
            split = peer_vllm.uses_split_kernel(r.batch, r.kv_heads, r.q_tokens, r.gqa)
            todo.append(peer_vllm.warm_spec(len(grid.probe_lengths(r.q_tokens)), r.kv_heads, r.window,
                                            r.kv_dtype, grid.PROBE_WIDTH, r.gqa, r.head_dim, r.sinks, r.q_tokens,
                                            split))
        for t in todo:
            if t not in specs:
                specs.append(t)
    return specs


def vllm_compile_check(args) -> str:
    """Compiles vLLM's kernels for every selected row's call shape for sm_90
    with the installed triton, without a GPU (peer_vllm.compile_check)."""
    import triton

    specs = vllm_specs(args.row_list)
    with tempfile.TemporaryDirectory(prefix="flint-triton-") as cache:
        spec_file = Path(cache) / "specs.json"
        spec_file.write_text(json.dumps(specs))
        t0 = time.time()
        done = subprocess.run([sys.executable, str(PEER_VLLM), "--compile-check", str(spec_file)],
                              capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, TRITON_CACHE_DIR=str(Path(cache) / "triton")))
        cubins = len(list((Path(cache) / "triton").glob("*/*.cubin")))
    if done.returncode != 0:
        return f"vllm-triton compile for sm_90 FAILED: {oneline(done.stderr, 1500)}"
    return (f"vllm-triton: its kernels compiled for sm_90 with triton {triton.__version__} (no GPU) for all "
            f"{len(specs)} call shapes of the selected rows: {cubins} cubins in {time.time() - t0:.0f} s")


# --- GPU run: the worker ------------------------------------------------------------------


class Worker:
    """Measures rows into ``state`` (meta, ceiling, rows), saving it after
    every step, resuming rows a previous worker left unfinished."""

    def __init__(self, args, G, torch, state: dict, json_path: Path, deadline: float,
                 timer=None, device="cuda"):
        self.args, self.G, self.torch, self.state = args, G, torch, state
        self.json_path, self.deadline, self.device = json_path, deadline, device
        self.timer = timer or G.graph_time
        self.ceiling_tbps = state["ceiling"]["tbps"]
        self.target = state["meta"].get("rotation_target_bytes") or target_bytes(args, grid.L2_BYTES_DEFAULT)
        self.pools = None

    # state helpers
    @property
    def meta(self) -> dict:
        return self.state["meta"]

    def save(self) -> None:
        report.write_json(self.json_path, self.meta, self.state["ceiling"], self.state["rows"])

    def mark(self, row: str | None, impl: str | None = None, cls=None, phase: str = "") -> None:
        """What runs now, for the supervisor (progress_path): a row's
        implementation in phase setup, first call (and check) or timing."""
        write_progress(self.json_path, None if row is None else {
            "row": row, "impl": impl, "class": cls, "phase": phase, "since": time.time()})

    def excluded(self, cls) -> dict | None:
        return next((x for x in self.meta.get("excluded", []) if x["class"] == cls), None)

    def result_for(self, row: grid.Row, n_sets: int, n_calls: int) -> dict:
        for res in self.state["rows"]:
            if res["row"] == row.name:
                return res
        res = base_result(row, self.ceiling_tbps, n_sets, n_calls)
        res["partial"] = True
        self.state["rows"].append(res)
        return res

    def done(self, name: str) -> bool:
        return any(r["row"] == name and not r.get("partial") for r in self.state["rows"])

    def factories(self):
        G = self.G
        table = {"flint": G.make_flint, "flint-split": G.make_flint_split,
                 "flint-balanced": G.make_flint_balanced, "vllm-triton": G.make_vllm,
                 "xqa": lambda inp, d: G.make_xqa(inp, d, self.args.setup_timeout_s * 0.8),
                 "sdpa": G.make_sdpa}
        return [(IMPLS[k], table[k]) for k in self.args.impl_list]

    # measuring
    def measure(self, impl, r: dict, inp, kv_dtype: str, n_calls: int, where=None) -> None:
        torch, args = self.torch, self.args
        if where:
            self.mark(*where, "first call")
        for o in impl.prefill:
            o.fill_(float("nan"))
        try:
            out = impl.fns[0]()
            if out is None:
                out = impl.prefill[0]
            if self.device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            r.update(status="error", reason="first call raised " + oneline(f"{type(e).__name__}: {e}"))
            if is_fatal(e):
                raise
            return
        if args.no_check:
            r["status"] = "unchecked"
        else:
            ok, rep = self.G.check(out, inp, kv_dtype, impl.check_idx, impl.tol, impl.sinkless)
            r.update(err=rep.rel_fro, max_abs=rep.max_abs, checked=impl.check_idx)
            if not ok:
                r.update(status="mismatch", reason=oneline(rep.describe(impl.tol)))
                return
            r["status"] = "ok"
        if where:
            self.mark(*where, "timing")
            test_fault(*where[:2])
        try:
            us, times = self.timer(impl.fns, n_calls, args.warmup, args.reps)
            r.update(us=us, replays_us=[round(t, 4) for t in times])
            if args.eager and self.device == "cuda":
                r["eager_us"] = self.G.eager_time(impl.fns, n_calls, 1, args.eager_reps)
        except Exception as e:  # noqa: BLE001
            r.update(status="error", reason="timing failed: " + oneline(f"{type(e).__name__}: {e}"))
            r.pop("us", None)
            if is_fatal(e):
                raise

    def run_impl(self, name: str, factory, row: grid.Row, inp, res: dict, n_calls: int) -> None:
        r = res["impls"].setdefault(name, {})
        cls = impl_class(name, row)
        ex = self.excluded(cls)
        if ex:
            r.update(status="missing", reason=f"not run: {ex['reason']} (in row {ex['row']}, same "
                     f"implementation, kv dtype, window, padding and shape)")
            return
        # A peer that could not be set up, or whose JIT module failed to build
        # (XQA's first call), fails the same way on every row of its dtype and
        # window: say so instead of paying for the build again.
        broken = self.meta.setdefault("broken", {})
        key = f"{name}/{row.kv_dtype}/{'window' if row.window else 'full'}/{row.shape}"  # shape: Q too
        peer = name in ("fi-xqa", "vllm-triton")
        if peer and key in broken:
            r.update(status="missing", reason=broken[key])
            return
        try:
            self._run_impl(name, factory, row, inp, r, n_calls, cls)
        finally:
            why = r.get("reason", "")
            if peer and (r.get("status") == "missing" or
                         (name == "fi-xqa" and why.startswith("first call raised"))):
                broken[key] = why if why.startswith("as in row") else f"as in row {row.name}: {why}"

    def _run_impl(self, name: str, factory, row: grid.Row, inp, r: dict, n_calls: int, cls) -> None:
        self.mark(row.name, name, cls, "setup")
        try:
            impl = factory(inp, row.kv_dtype)
        except self.G.Unavailable as e:
            r.update(status="missing", reason=str(e))
            return
        except self.G.Mismatch as e:  # a check made while setting up (the draft probe)
            r.update(status="mismatch", reason=oneline(str(e)))
            return
        except Exception as e:  # noqa: BLE001
            r.update(status="missing", reason="setup raised " + oneline(f"{type(e).__name__}: {e}"))
            if is_fatal(e):
                raise
            return
        if impl.note:
            r["note"] = impl.note
        if impl.probe_err is not None:  # Q > 1: the draft probe passed (bench_gpu.draft_probe)
            r["probe_err"] = impl.probe_err
        self.measure(impl, r, inp, row.kv_dtype, n_calls, where=(row.name, name, cls))

    def run_row(self, row: grid.Row, inp, n_sets: int, t_row: float) -> dict:
        args = self.args
        n_calls = grid.num_calls(row, n_sets, self.ceiling_tbps, args.target_us, args.min_calls,
                                 args.max_calls)
        res = self.result_for(row, n_sets, n_calls)
        if "flint" in args.impl_list and "flint" not in res["balance"]:
            res["balance"]["flint"] = self.G.plan_balance(inp, row.kv_dtype)
        if "flint-split" in args.impl_list and "flint-split" not in res["balance"]:
            res["balance"]["flint-split"] = self.G.plan_balance(inp, row.kv_dtype, split=True)
        self.save()  # the partial row: a lost worker's error lands on it
        waited0 = self.prebuild_waited()
        for name, factory in self.factories():
            prior = res["impls"].get(name, {})
            if prior.get("status") in ("ok", "unchecked", "mismatch", "error", "missing", "skipped"):
                continue  # measured (or failed) by a previous worker
            if name == "sdpa" and (row.kv_dtype != "bf16" or row.lengths is not None or row.q_tokens > 1):
                continue
            t0 = time.time()
            waited = self.prebuild_waited() - waited0
            if time.time() > self.deadline:
                res["impls"][name] = {"status": "skipped", "reason": "the run's --budget-s was spent"}
            elif time.time() - t_row - waited > args.row_budget_s:
                res["impls"][name] = {"status": "skipped",
                                      "reason": f"the row's --row-budget-s {args.row_budget_s:g} was spent"}
            else:
                try:
                    self.run_impl(name, factory, row, inp, res, n_calls)
                except Exception as e:  # noqa: BLE001
                    msg = oneline(f"{type(e).__name__}: {e}", 1000)
                    res["impls"].setdefault(name, {}).update(status="error", reason=msg)
                    if is_fatal(e):  # record, exclude, save; the supervisor starts a new worker
                        self.meta.setdefault("excluded", []).append(
                            {"class": impl_class(name, row), "row": row.name, "reason": "fatal CUDA error: " + msg})
                        self.meta["fatal"] = {"row": row.name, "impl": name, "error": msg}
                        report.fill_rates(res, self.ceiling_tbps)
                        self.save()
                        self.mark(None)
                        raise
                    log(f"  {name} raised (the run goes on): {msg[:500]}")
                    self._free()
            r = res["impls"][name]
            self.save()
            us = r.get("us")
            err = f" err {r['err']:.2g}" if r.get("err") is not None else ""
            log(f"  {name}: " + (f"{us:.2f} µs ({row.kv_bytes / (us * 1e-6) / 1e12:.2f} TB/s){err}" if us
                                 else f"{r['status']}: {r.get('reason', '')[:300]}")
                + f"  [{time.time() - t0:.1f} s]")
        res.pop("partial", None)
        report.fill_rates(res, self.ceiling_tbps)
        self.save()
        self.mark(None)
        return res

    def prebuild_waited(self) -> float:
        pb = self.G.PREBUILD
        return getattr(pb, "waited", 0.0) if pb is not None else 0.0

    def run(self, rows: list[grid.Row], shared=None) -> None:
        """Measures ``rows`` (bf16 rows and twins), twins on shared inputs."""
        args, G = self.args, self.G
        bases = base_rows(rows)
        t_start = time.time()
        for i, base in enumerate(bases):
            twins = [r for r in rows if r.twin == base.name]
            todo = [r for r in twins if not self.done(r.name)]
            if not todo:
                continue
            if time.time() > self.deadline:
                names = [r.name for b in bases[i:] for r in rows if r.twin == b.name and not self.done(r.name)]
                self.meta.setdefault("skipped", []).append(
                    f"skipped (--budget-s {args.budget_s:g} spent): {', '.join(names)}")
                self.save()
                log(f"budget spent: skipping {len(names)} rows")
                return
            t_row = time.time()
            n_sets = sets_of(base, todo, self.target)
            left = self.deadline - time.time()
            log(f"[{i + 1}/{len(bases)} {time.time() - t_start:.0f} s, {left:.0f} s left] {base.name}: "
                f"{base.summary.describe()}, kvH {base.kv_heads}, window {base.window or '-'}, table "
                f"{base.width}, {base.placement}; " + "; ".join(
                    f"{r.kv_dtype}: KV {r.kv_bytes / 1e6:.1f} MB, floor {r.floor_us(self.ceiling_tbps):.2f} µs, "
                    f"goal {r.goal_us():.2f} µs, {n_sets[r.kv_dtype]} sets" for r in todo))
            try:
                inp = G.build_inputs(base, n_sets, shared, args.seed + 1000 * i, self.device)
            except Exception as e:  # noqa: BLE001 (keep what was measured)
                msg = f"{base.name}: inputs failed: {type(e).__name__}: {oneline(str(e), 1000)}"
                log(msg)
                self.meta.setdefault("failed_rows", []).append(msg)
                for r in todo:  # done, with nothing measured: a restart does not retry it
                    res = self.result_for(r, n_sets[r.kv_dtype], 0)
                    res.pop("partial", None)
                    res["failed"] = msg
                self.save()
                if is_fatal(e):
                    raise
                self._free()
                continue
            try:
                for r in todo:
                    try:
                        self.run_row(r, inp, n_sets[r.kv_dtype], t_row)
                    except Exception as e:  # noqa: BLE001 (a bug or OOM of one row: the run goes on)
                        if is_fatal(e):
                            raise
                        msg = f"{r.name}: {type(e).__name__}: {oneline(str(e), 1000)}"
                        log(f"[{r.name}] failed: {msg}")
                        self.meta.setdefault("failed_rows", []).append(msg)
                        res = self.result_for(r, n_sets[r.kv_dtype], 0)
                        res.pop("partial", None)
                        res["failed"] = msg
                        self.save()
                        self.mark(None)
                    t_row = time.time()
            finally:
                del inp
                self._free()
            log(f"[{base.name}] {time.time() - t_start:.0f} s into the run")

    def _free(self) -> None:
        gc.collect()
        if self.device == "cuda":
            self.torch.cuda.empty_cache()


def gpu_meta(args, torch, target: int, l2: int) -> dict:
    from benchmarks.peers import peer_vllm

    if args.device == "cpu":
        props = type("CPU", (), {"name": "CPU (--device cpu: plumbing test, not a benchmark)",
                                 "multi_processor_count": 0})
    else:
        props = torch.cuda.get_device_properties(0)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": f"{props.name} ({props.multi_processor_count} SMs, L2 {l2 / 1e6:.0f} MB)",
        "sms": props.multi_processor_count, "l2_bytes": l2, "torch": torch.__version__,
        "cuda": torch.version.cuda, "triton": triton_version, "flashinfer": None,
        "vllm_triton": peer_vllm.source_info().get("vllm_version"), "commit": git_commit(),
        "method": method(args, target), "rotation_target_bytes": target,
        "argv": [a for a in sys.argv[1:]], "budget_s": args.budget_s,
    }


def worker_main(args) -> int:
    import torch

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("bench_decode.py needs a CUDA GPU (an H200); without one, use --dry-run.")
    if not cuda and not args.ceiling:
        sys.exit("--device cpu needs --ceiling")
    from benchmarks import bench_gpu as G
    from benchmarks.peers import peer_xqa

    if "FLINT_PDL" in os.environ:  # read once by the op: default timings need it unset
        log(f"warning: FLINT_PDL={os.environ['FLINT_PDL']} is set: unset for this run (default timings)")
        os.environ.pop("FLINT_PDL")
    l2 = grid.L2_BYTES_DEFAULT
    if cuda:
        props = torch.cuda.get_device_properties(0)
        l2 = getattr(props, "L2_cache_size", 0) or l2
        if torch.cuda.get_device_capability(0) != (9, 0):
            log(f"warning: {props.name} is not SM90: Flint and XQA target Hopper")
    target = target_bytes(args, l2)
    json_path = Path(args.json)
    deadline = args.deadline or time.time() + args.budget_s
    state = {"meta": gpu_meta(args, torch, target, l2), "ceiling": None, "rows": []}
    if json_path.exists():  # resume what a previous worker left
        saved = json.loads(json_path.read_text())
        state["rows"] = saved.get("rows", [])
        state["ceiling"] = saved.get("ceiling")
        for k in ("excluded", "failed_rows", "skipped", "restarts", "prebuild", "broken"):
            if k in saved.get("meta", {}):
                state["meta"][k] = saved["meta"][k]
        log(f"resuming {json_path}: {sum(not r.get('partial') for r in state['rows'])} rows done, "
            f"excluded: {[x['class'] for x in state['meta'].get('excluded', [])]}")
    if "xqa" in args.impl_list:
        try:
            state["meta"]["flashinfer"] = peer_xqa.import_flashinfer().__version__
            if not args.no_prebuild:
                variants = sorted({G.xqa_variant(r) for r in args.row_list})
                G.PREBUILD = peer_xqa.Prebuild(variants, log).start()
        except Exception as e:  # noqa: BLE001
            log(f"flashinfer missing: {type(e).__name__}: {e}")
    log(f"{state['meta']['gpu']}, torch {state['meta']['torch']}, commit {state['meta']['commit']}, "
        f"{len(args.row_list)} rows x {len(args.impl_list)} implementations, "
        f"{deadline - time.time():.0f} s budget left")
    if state["ceiling"] is None:
        if args.ceiling:
            state["ceiling"] = {"tbps": args.ceiling, "kernel": "given by --ceiling", "bytes": 0}
        else:
            log(f"measuring the HBM read ceiling ({args.ceiling_gib} GiB)")
            state["ceiling"] = G.measure_ceiling(args.ceiling_gib, log)
    log(report.ceiling_line(state["ceiling"]))
    worker = Worker(args, G, torch, state, json_path, deadline,
                    timer=None if cuda else G.wall_time, device=args.device)
    worker.save()
    shared = None
    if any(r.placement == "pool" for r in args.row_list):
        t0 = time.time()
        fp8 = any(r.kv_dtype == "fp8" and r.placement == "pool" for r in args.row_list)
        shared = G.SharedPools(int(args.pool_gib * 2**30), args.device, args.seed, fp8)
        state["meta"]["pool"] = {"bf16_bytes": shared.bf16.nbytes, "blocks_8_heads": shared.bf16.num_blocks,
                                 "fp8_bytes": shared.fp8.nbytes if shared.fp8 else 0}
        log(f"KV pool: {shared.bf16.nbytes / 2**30:.1f} GiB bf16" +
            (f" + {shared.fp8.nbytes / 2**30:.1f} GiB fp8" if shared.fp8 else "") +
            f", {shared.bf16.num_blocks} blocks of 8 kv heads, filled in {time.time() - t0:.1f} s")
    try:
        worker.run(args.row_list, shared)
    except Exception as e:  # noqa: BLE001
        if is_fatal(e):
            log(f"CUDA context broken ({oneline(str(e), 300)}): this worker stops")
            return 3
        raise
    finally:
        if G.PREBUILD is not None:
            state["meta"]["prebuild"] = {"seconds": G.PREBUILD.seconds, "error": G.PREBUILD.error}
        worker.save()
    return 0


# --- GPU run: the supervisor --------------------------------------------------------------


def progress_path(json_path: Path) -> Path:
    """Where the worker says what it runs now: in the temp folder (not beside
    the JSON: the device tool returns at most 8 files from $OUT), named after
    the JSON's path so that supervisor and worker agree on it."""
    tag = hashlib.sha1(str(json_path.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"flint-bench-{tag}.progress.json"


def write_progress(json_path: Path, cur: dict | None) -> None:
    path = progress_path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cur))
    tmp.replace(path)


def in_progress(json_path: Path) -> dict | None:
    try:
        return json.loads(progress_path(json_path).read_text())
    except (OSError, ValueError):
        return None


def record_lost_worker(json_path: Path, why: str) -> str | None:
    """After a worker died or hung: the implementation it was running gets an
    error and its kind of row is excluded. Returns a line saying what, or None
    when nothing was in progress."""
    if not json_path.exists():
        return None
    d = json.loads(json_path.read_text())
    meta = d.get("meta", {})
    cur = in_progress(json_path)
    meta.setdefault("restarts", []).append(why)
    if cur and cur.get("impl"):
        for res in d.get("rows", []):
            if res["row"] == cur["row"]:
                res["impls"].setdefault(cur["impl"], {}).update(status="error",
                                                                 reason=f"{why} during {cur['phase']}")
        meta.setdefault("excluded", []).append({"class": cur["class"], "row": cur["row"], "reason": why})
    report.write_json(json_path, meta, d.get("ceiling", {}), d.get("rows", []))
    write_progress(json_path, None)
    if not cur or not cur.get("impl"):
        return None
    return f"{cur['row']} / {cur['impl']}: {why} during {cur['phase']}"


def start_jit_warmers(args, json_path: Path) -> list:
    """peer_vllm.py --warm processes for the selected rows' vLLM kernels."""
    from benchmarks.peers import peer_vllm

    if "vllm-triton" not in args.impl_list or args.jit_warmers <= 0 or args.device != "cuda":
        return []
    if not (peer_vllm.PEER_DIR / "triton_unified_attention.py").exists():
        return []
    specs = vllm_specs(args.row_list)
    procs = []
    folder = Path(tempfile.mkdtemp(prefix="flint-bench-warm-"))
    for i, part in enumerate(peer_vllm.partition(specs, args.jit_warmers)):
        path = folder / f"specs{i}.json"
        path.write_text(json.dumps(part))
        procs.append(subprocess.Popen([sys.executable, str(PEER_VLLM), "--warm", str(path)]))
    log(f"compiling vLLM's Triton kernels ahead in {len(procs)} processes ({len(specs)} call shapes)")
    return procs


def supervise(args, argv: list[str]) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path, png_path = paths(args, stamp, Path(args.out_dir))
    deadline = time.time() + args.budget_s
    try:
        warmers = start_jit_warmers(args, json_path)
    except Exception as e:  # noqa: BLE001 (an optimization only)
        log(f"no Triton warm-up: {type(e).__name__}: {e}")
        warmers = []
    try:
        return _supervise(args, argv, json_path, png_path, deadline)
    finally:
        for w in warmers:
            if w.poll() is None:
                w.kill()
                w.wait()
        progress_path(json_path).unlink(missing_ok=True)


def _supervise(args, argv, json_path: Path, png_path: Path, deadline: float) -> int:
    worker_argv = [a for a in argv]
    if not args.json:
        worker_argv += ["--json", str(json_path)]
    worker_argv += ["--worker", "--deadline", repr(deadline)]
    restarts, rc = 0, None
    while True:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *worker_argv])
        why = None
        while proc.poll() is None:
            time.sleep(1.0)
            cur = in_progress(json_path)
            limit = {"setup": args.setup_timeout_s, "first call": args.first_call_timeout_s}.get(
                (cur or {}).get("phase"), args.impl_timeout_s)
            if cur and time.time() - cur["since"] > limit:
                why = f"hung: no progress for {limit:g} s"
            elif time.time() > deadline + 120:
                why = "the run's budget was overrun by 120 s"
            if why:
                proc.kill()
                proc.wait()
                break
        rc = proc.returncode
        if rc == 0:
            break
        what = record_lost_worker(json_path, why or f"worker exited with rc {rc}")
        log(f"worker lost ({why or f'rc {rc}'}): {what or 'nothing was in progress'}")
        restarts += 1
        if restarts > args.max_restarts or time.time() > deadline - 15 or (what is None and rc != 3):
            log("not restarting: " + ("too many restarts" if restarts > args.max_restarts else
                                      "no time left" if time.time() > deadline - 15 else
                                      "the failure is not tied to an implementation"))
            break
        log(f"restarting the worker ({restarts} of at most {args.max_restarts})")
    if not json_path.exists():
        log("no results were written")
        return 1
    meta, ceiling, results = report.load_json(json_path)
    meta["wall_s"] = round(time.time() - (deadline - args.budget_s), 1)
    final_report(args, meta, ceiling, results, json_path, png_path)
    return 0 if rc == 0 else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.list_rows:
        return list_rows(args)
    if args.dry_run:
        return dry_run(args)
    if args.worker:
        return worker_main(args)
    if args.no_supervisor:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        json_path, png_path = paths(args, stamp, Path(args.out_dir))
        args.json = str(json_path)
        rc = worker_main(args)
        meta, ceiling, results = report.load_json(json_path)
        final_report(args, meta, ceiling, results, json_path, png_path)
        return rc
    return supervise(args, argv)


if __name__ == "__main__":
    sys.exit(main())
