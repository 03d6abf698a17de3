"""Benchmark of Flint's paged decode attention against the HBM read ceiling and
its peers, all measured in the same run on identical inputs.

What is timed
    One query token per request, GQA 8, head_dim 128, bf16 HND cache
    [num_blocks, kv_heads, 16, 256] (K in [..., :128], V in [..., 128:]), fp32
    sinks, scale 128**-0.5, every seq_len = L. Each row builds enough distinct
    input sets (its own KV cache, q, out and a random block table of shuffled
    block ids) that one rotation touches >= 3 x L2 (>= 180 MB on an H200,
    60 MB of L2): consecutive calls never find their K/V in L2. A set whose own
    pages already exceed that is used alone.

    Per implementation: one eager call on set 0 whose output is checked
    against a float64 reference (requests 0 and B-1) before anything is timed
    -- a mismatch is reported, never timed; then every set is called once
    eagerly on the capture stream (the op allocates its persistent workspace on
    its first eager call, which must precede capture), one CUDA graph captures
    N back-to-back calls rotating over the sets (N ~ 5 ms of work at the
    floor, at least 8 and every set once), 3 warm-up replays, then the median
    of 20 timed replays (CUDA events); time per call = replay time / N. With
    --eager, plain eager loops of the same N calls are timed too (CUDA events
    around the loop, median of 5): the difference is launch overhead.

Ceiling and the numbers in every row
    The ceiling is the best of a few plain streaming reads of one 4 GiB buffer
    measured in the same process: torch.sum over bf16, sums over fp32 and
    int64 views, and our Triton read-reduce kernel (16-byte vector loads, a
    persistent grid) in a few shapes. KV bytes are the attended K+V bytes a
    call needs: B x kv_heads x attended positions x 512 (q/out bytes are a
    separate column in the JSON); floor = KV bytes / ceiling; TB/s = KV bytes /
    time; % ceil = TB/s / ceiling.

flint-nopdl (--impls ...,nopdl): flint launched without programmatic dependent
launch (FLINT_PDL=0), to show what PDL buys in a chain of calls.
flint[VAR=VALUE] (--impls ...,flint:VAR=VALUE[+VAR=VALUE...]): flint with FLINT_*
diagnostic variables set, an A/B in one run (e.g. flint:FLINT_PDL=0).

Peers (same inputs, same run; one that cannot run is reported missing, with
the exception text, never estimated)
    fi-xqa          FlashInfer trtllm_batch_decode_with_kv_cache(backend="xqa"):
                    its Hopper decode, with sinks, window_left = W - 1, HND,
                    on zero-copy K/V views of our cache.
    fi-batchdecode  FlashInfer BatchDecodeWithPagedKVCacheWrapper (tensor
                    cores, HND), only where XQA cannot run (or --impls fa2);
                    it ignores sinks, so it is checked against a sink-free
                    reference.
    sdpa            torch scaled_dot_product_attention (fused backends) on a
                    dense unpaged copy of the attended K/V, no sinks: context.

Tuning
    The op reads FLINT_LAUNCH_CONFIG="splits,warps,stages,min_pages,cluster"
    at each call (a captured graph keeps the config it was captured with).
    --config S,W,ST,MP,C adds a "flint@S,..." column; --sweep times, per row,
    up to --sweep-limit configs around the default (the spec's _launch_config
    reproduced here) and prints the best against the default. Configs the op
    rejects (RuntimeError / ValueError) are skipped.

Outputs
    A Markdown table on stdout (plus eager and sweep tables when asked), the
    ceiling line, a block to paste into the session's log (benchmarks/logs/), JSON
    (--json, default <out-dir>/bench_<timestamp>.json, rewritten after every
    row) and a PNG plot of TB/s against KV bytes (<out-dir>/bench_<timestamp>.png).

Usage (GPU)
    python benchmarks/bench_decode.py --out-dir $OUT            # whole grid
    python benchmarks/bench_decode.py --quick --eager
    python benchmarks/bench_decode.py --rows b1_l8k,swa128_b16_l8k --sweep
    python benchmarks/bench_decode.py --rows "custom:32,8,4096;custom:8,8,8192,128"
Without a GPU: --dry-run prints the grid, bytes and floors at an assumed
ceiling and exercises the reporting on fake timings; --list-rows lists rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_grid as grid  # noqa: E402
import bench_report as report  # noqa: E402

REPO = HERE.parent
IMPLS = ("flint", "nopdl", "xqa", "fa2", "sdpa")
IMPL_NAMES = {"flint": "flint", "xqa": "fi-xqa", "fa2": "fi-batchdecode", "sdpa": "sdpa"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_FATAL = re.compile(r"CUDA error|illegal memory access|illegal instruction|unspecified launch failure|"
                    r"misaligned address")


def _is_fatal(e: BaseException) -> bool:
    """A CUDA error that leaves the context unusable: nothing after it can run."""
    return bool(_FATAL.search(str(e)))


def _oneline(msg: str, limit: int = 2000) -> str:
    return " | ".join(line.strip() for line in msg.strip().splitlines() if line.strip())[:limit]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Flint paged decode attention benchmark (see the module docstring for the method).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sel = p.add_argument_group("rows")
    sel.add_argument("--rows", help="comma-separated row names; custom rows as custom:B,kvH,L[,W], "
                     "several separated by ';'")
    sel.add_argument("--quick", action="store_true", help=f"only {', '.join(grid.QUICK_ROWS)}")
    sel.add_argument("--list-rows", action="store_true", help="list the grid and exit")
    imp = p.add_argument_group("implementations")
    imp.add_argument("--impls", default=None,
                     help=f"comma-separated subset of {','.join(IMPLS)} "
                          "(default flint,xqa,sdpa; flint only with --sweep)")
    imp.add_argument("--config", help="also time flint with FLINT_LAUNCH_CONFIG=S,W,ST,MP,C")
    imp.add_argument("--sweep", action="store_true", help="per row, time candidate launch configs")
    imp.add_argument("--sweep-limit", type=int, default=40, help="max configs per row in --sweep")
    imp.add_argument("--sweep-configs",
                     help="with --sweep: time exactly these configs (S,W,ST,MP,C;...) "
                          "instead of the ones around the default")
    imp.add_argument("--eager", action="store_true", help="also time eager loops (launch overhead)")
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
    c = p.add_argument_group("checking")
    c.add_argument("--tol", type=float, default=2e-2,
                   help="max |out - ref| / max |ref| allowed (float64 reference, 2 requests)")
    c.add_argument("--no-check", action="store_true", help="time without checking outputs")
    c.add_argument("--seed", type=int, default=0)
    o = p.add_argument_group("output")
    o.add_argument("--out-dir", default=str(HERE / "results"), help="JSON and PNG go here")
    o.add_argument("--json", help="JSON path (default <out-dir>/bench_<timestamp>.json)")
    o.add_argument("--no-plot", action="store_true")
    o.add_argument("--dry-run", action="store_true",
                   help="no GPU: print the grid and exercise the reporting with fake timings")
    o.add_argument("--sms", type=int, default=grid.SMS_DEFAULT, help="SM count assumed by --dry-run")
    args = p.parse_args(argv)
    try:
        args.row_list = grid.select_rows(args.rows, args.quick)
        args.config_t = grid.parse_config(args.config) if args.config else None
    except ValueError as e:
        p.error(str(e))
    default_impls = "flint" if args.sweep else "flint,xqa,sdpa"
    args.impl_list = [s.strip() for s in (args.impls or default_impls).split(",") if s.strip()]
    bad = [s for s in args.impl_list if s not in IMPLS and not _env_impl(s)]
    if bad:
        p.error(f"unknown implementation(s) {bad}; choose from {IMPLS}")
    if args.reps < 1 or args.sweep_limit < 1:
        p.error("--reps and --sweep-limit must be >= 1")
    return args


def _env_impl(key: str):
    """'flint:VAR=VALUE[+VAR=VALUE...]' (an A/B of diagnostic variables in one run)
    -> {VAR: VALUE}, or None."""
    return grid.parse_env(key[len("flint:"):]) if key.startswith("flint:") else None


def _target_bytes(args, l2_bytes: int) -> int:
    return int(max(3 * grid.L2_BYTES_DEFAULT, args.l2_multiple * l2_bytes))


def _git_commit() -> str | None:
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


def _method(args, target_bytes: int) -> str:
    return (f"CUDA graph of N back-to-back calls rotating over input sets totalling "
            f">= {target_bytes / 1e6:.0f} MB (L2 cold), {args.warmup} warm-up replays, median of "
            f"{args.reps} replays, µs per call = replay / N; outputs checked against float64 "
            f"(tol {args.tol:g}) before timing")


def grid_table(rows, args, ceiling_tbps: float, sms: int, l2_bytes: int) -> str:
    target = _target_bytes(args, l2_bytes)
    head = ["row", "B", "kvH", "L", "win", "KV MB", "q+out KB", "set MB", "sets", "calls",
            "GPU GB", "floor µs", "default cfg", "sweep"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        n = grid.num_sets(r, target)
        calls = grid.num_calls(r, n, ceiling_tbps, args.target_us, args.min_calls, args.max_calls)
        paged = n * (r.num_blocks * r.block_bytes + r.qo_bytes)
        gpu_gb = (paged + (n * r.dense_bytes if "sdpa" in args.impl_list else 0)) / 1e9
        cfg = grid.row_launch_config(r, sms)
        nsw = len(grid.sweep_candidates(r, sms, args.sweep_limit))
        lines.append("| " + " | ".join([
            r.name, str(r.batch), str(r.kv_heads), str(r.seq_len), str(r.window or "—"),
            f"{r.kv_bytes / 1e6:.1f}", f"{r.qo_bytes / 1e3:.1f}", f"{r.set_bytes / 1e6:.1f}", str(n),
            str(calls), f"{gpu_gb:.2f}", f"{r.floor_us(ceiling_tbps):.2f}", grid.format_config(cfg),
            str(nsw)]) + " |")
    return "\n".join(lines)


def _base_result(row: grid.Row, ceiling_tbps: float, n_sets: int, n_calls: int, sms: int) -> dict:
    return {
        "row": row.name, "batch": row.batch, "kv_heads": row.kv_heads, "seq_len": row.seq_len,
        "window": row.window, "kv_bytes": row.kv_bytes, "qo_bytes": row.qo_bytes,
        "set_bytes": row.set_bytes, "floor_us": row.floor_us(ceiling_tbps), "n_sets": n_sets,
        "n_calls": n_calls,
        "flint_default_config": grid.format_config(
            grid.row_launch_config(row, sms)),
        "impls": {},
    }


def _emit(text: str = "") -> None:
    print(text, flush=True)


def _final_report(args, meta, ceiling, results, json_path: Path, png_path: Path) -> None:
    _emit()
    _emit(report.ceiling_line(ceiling))
    _emit()
    _emit(report.markdown_table(results))
    for line in report.notes(results):
        _emit(line)
    for m in meta.get("failed_rows", []):
        _emit(f"- row failed: {m}")
    et = report.eager_table(results)
    if et:
        _emit("\nEager loops vs graph replay (µs per call):\n")
        _emit(et)
    for res in results:
        if res.get("sweep"):
            _emit()
            _emit(report.sweep_report(res, ceiling["tbps"]))
    report.write_json(json_path, meta, ceiling, results)
    _emit(f"\njson: {json_path}")
    if not args.no_plot:
        try:
            _emit(report.plot(png_path, ceiling, results))
        except Exception as e:  # noqa: BLE001 (a plot failure must not lose the results)
            _emit(f"plot failed: {type(e).__name__}: {e}")
    _emit("\n----- paste into benchmarks/RESULTS.md -----")
    _emit(report.results_block(meta, ceiling, results))
    _emit("----- end -----")


def _paths(args, stamp: str, out_dir: Path) -> tuple[Path, Path]:
    json_path = Path(args.json) if args.json else out_dir / f"bench_{stamp}.json"
    return json_path, out_dir / (json_path.stem + ".png")


# --- dry run ------------------------------------------------------------------------------


def dry_run(args) -> int:
    ceiling_tbps = args.ceiling or 4.8
    l2 = grid.L2_BYTES_DEFAULT
    rows = args.row_list
    _emit(f"dry run: no GPU touched; assumed ceiling {ceiling_tbps} TB/s, {args.sms} SMs, "
          f"L2 {l2 / 1e6:.0f} MB, rotation target {_target_bytes(args, l2) / 1e6:.0f} MB\n")
    _emit(grid_table(rows, args, ceiling_tbps, args.sms, l2))
    # Fake timings exercise the reporting end to end.
    results = []
    target = _target_bytes(args, l2)
    for i, row in enumerate(rows):
        n = grid.num_sets(row, target)
        res = _base_result(row, ceiling_tbps, n, grid.num_calls(
            row, n, ceiling_tbps, args.target_us, args.min_calls, args.max_calls), args.sms)
        fl = row.floor_us(ceiling_tbps)
        res["impls"]["flint"] = {"status": "ok", "us": fl * 1.12 + 1.5, "eager_us": fl * 1.12 + 9,
                                 "err": 2e-3}
        if args.config_t:
            res["impls"][f"flint@{grid.format_config(args.config_t)}"] = {
                "status": "ok", "us": fl * 1.2 + 1.5, "note": "FLINT_LAUNCH_CONFIG=" + args.config}
        res["impls"]["fi-xqa"] = {"status": "ok", "us": fl * 1.35 + 3, "eager_us": fl * 1.35 + 25,
                                  "note": "FAKE flashinfer backend=xqa"}
        if i == len(rows) - 1:
            res["impls"]["sdpa"] = {"status": "missing", "reason": "FAKE: RuntimeError: no kernel"}
        else:
            res["impls"]["sdpa"] = {"status": "ok", "us": fl * 2.5 + 8, "note": "FAKE torch SDPA"}
        if args.sweep and i == 0:
            cands = grid.sweep_candidates(row, args.sms, args.sweep_limit)
            cl = [{"config": grid.format_config(c), "status": "ok",
                   "us": fl * (1.0 + 0.02 * k) + 1.5} for k, c in enumerate(cands)]
            cl[-1] = {"config": cl[-1]["config"], "status": "rejected", "reason": "FAKE"}
            res["sweep"] = {"default": res["flint_default_config"], "default_us": cl[0]["us"],
                            "candidates": cl, "best": min((c for c in cl if c.get("us")),
                                                          key=lambda c: c["us"])}
        report.fill_rates(res, ceiling_tbps)
        results.append(res)
    meta = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": "DRY RUN (fake timings)", "torch": "n/a", "cuda": "n/a", "flashinfer": None,
            "commit": _git_commit(), "method": _method(args, target), "dry_run": True}
    ceiling = {"tbps": ceiling_tbps, "kernel": "assumed", "bytes": 0}
    out_dir = Path(args.out_dir) if args.out_dir != str(HERE / "results") else Path(
        tempfile.mkdtemp(prefix="flint-bench-dry-"))
    json_path, png_path = _paths(args, "dryrun", out_dir)
    _final_report(args, meta, ceiling, results, json_path, png_path)
    return 0


# --- GPU run ------------------------------------------------------------------------------


class Runner:
    def __init__(self, args, G, torch, ceiling_tbps: float, sms: int, target_bytes: int):
        self.args, self.G, self.torch = args, G, torch
        self.ceiling_tbps, self.sms, self.target_bytes = ceiling_tbps, sms, target_bytes
        # FlashInfer failures (import, JIT build, first call) per (impl, sliding, kv heads):
        # later rows report them instead of rebuilding for ~20 s each time.
        self.fi_broken: dict = {}

    def measure(self, impl, r: dict, refs, n_calls: int, rejectable: bool = False) -> bool:
        """Check (unless --no-check) then time one implementation into r."""
        torch, G, args = self.torch, self.G, self.args
        for o in impl.prefill:
            o.fill_(float("nan"))
        try:
            out = impl.fns[0]()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}".strip()
            fatal = _is_fatal(e)
            status = "rejected" if rejectable and isinstance(e, (RuntimeError, ValueError)) and not fatal \
                else "error"
            r.update(status=status, reason="first call raised " + _oneline(msg))
            if status == "error":
                log(f"  first call raised:\n{msg[:4000]}")
            if fatal:
                raise
            return False
        if args.no_check:
            r["status"] = "unchecked"
        else:
            ok, err, detail = G.compare(out, refs(impl.sinks), args.tol)
            r["err"] = err
            if not ok:
                r.update(status="mismatch",
                         reason=f"max|out-ref|/max|ref| = {err:.3g} > {args.tol:g} ({detail})")
                return False
            r["status"] = "ok"
        try:
            us, times = G.graph_time(impl.fns, n_calls, args.warmup, args.reps)
            r.update(us=us, replays_us=[round(t, 4) for t in times])
            if args.eager:
                r["eager_us"] = G.eager_time(impl.fns, n_calls, 1, args.eager_reps)
        except Exception as e:  # noqa: BLE001
            r.update(status="error", reason="timing failed: " + _oneline(f"{type(e).__name__}: {e}"))
            if _is_fatal(e):
                raise
            return False
        return True

    def setup_and_measure(self, factory, inp, r: dict, refs, n_calls: int) -> None:
        try:
            impl = factory(inp)
        except self.G.Unavailable as e:
            r.update(status="missing", reason=str(e))
            return
        except Exception as e:  # noqa: BLE001
            r.update(status="missing", reason="setup raised " + _oneline(f"{type(e).__name__}: {e}"))
            if _is_fatal(e):
                raise
            return
        if impl.note:
            r["note"] = impl.note
        self.measure(impl, r, refs, n_calls)

    def factories(self):
        G, args = self.G, self.args
        out = []
        for key in args.impl_list:
            if key == "flint":
                out.append(("flint", G.make_flint))
                if args.config_t:
                    cfg = args.config_t
                    out.append((f"flint@{grid.format_config(cfg)}",
                                lambda inp, cfg=cfg: G.flint_with_config(G.make_flint(inp), cfg)))
            elif key == "nopdl":
                out.append(("flint-nopdl", G.make_flint_nopdl))
            elif env := _env_impl(key):
                name = "+".join(f"{k}={v}" for k, v in env.items())
                out.append((f"flint[{name}]", lambda inp, e=env:
                            G.flint_with_env(G.make_flint(inp), e)))
            elif key == "xqa":
                out.append(("fi-xqa", G.make_xqa))
            elif key == "fa2":
                out.append(("fi-batchdecode", G.make_fi_batch_decode))
            elif key == "sdpa":
                out.append(("sdpa", G.make_sdpa))
        return out

    def run_row(self, row: grid.Row) -> dict:
        torch, G, args = self.torch, self.G, self.args
        n_sets = grid.num_sets(row, self.target_bytes)
        n_calls = grid.num_calls(row, n_sets, self.ceiling_tbps, args.target_us, args.min_calls,
                                 args.max_calls)
        res = _base_result(row, self.ceiling_tbps, n_sets, n_calls, self.sms)
        log(f"[{row.name}] {row.describe()}: KV {row.kv_bytes / 1e6:.1f} MB, {n_sets} set(s) x "
            f"{row.set_bytes / 1e6:.1f} MB, {n_calls} calls/graph")
        inp = G.make_inputs(row, n_sets, args.seed, "cuda")
        ref_cache = {}

        def refs(with_sinks: bool):
            if with_sinks not in ref_cache:
                ref_cache[with_sinks] = G.reference(inp, with_sinks)
            return ref_cache[with_sinks]

        todo = self.factories()
        while todo:
            name, factory = todo.pop(0)
            r = res["impls"].setdefault(name, {})
            t0 = time.time()
            fi_key = (name, row.window is not None, row.kv_heads) if name.startswith("fi-") else None
            if fi_key in self.fi_broken:
                r.update(status="missing", reason=self.fi_broken[fi_key])
            else:
                self.setup_and_measure(factory, inp, r, refs, n_calls)
                if fi_key and r["status"] in ("missing", "error") \
                        and not r["reason"].startswith("timing failed"):
                    self.fi_broken[fi_key] = f"as in row {row.name}: {r['reason']}"
            us = r.get("us")
            log(f"  {name}: " + (f"{us:.2f} µs ({row.kv_bytes / (us * 1e-6) / 1e12:.2f} TB/s)" if us
                                 else f"{r['status']}: {r.get('reason', '')[:300]}")
                + f"  [{time.time() - t0:.1f} s]")
            if (name == "fi-xqa" and r["status"] in ("missing", "error")
                    and "fa2" not in args.impl_list):
                log("  XQA unavailable: falling back to FlashInfer's BatchDecodeWithPagedKVCacheWrapper")
                todo.insert(0, ("fi-batchdecode", G.make_fi_batch_decode))
        if args.sweep:
            res["sweep"] = self.sweep(row, inp, refs, n_calls, res["impls"].get("flint", {}).get("us"))
        report.fill_rates(res, self.ceiling_tbps)
        del inp, ref_cache
        gc.collect()
        torch.cuda.empty_cache()
        return res

    def sweep(self, row, inp, refs, n_calls: int, default_us) -> dict:
        G = self.G
        default = grid.row_launch_config(row, self.sms)
        sw = {"default": grid.format_config(default), "default_us": default_us, "candidates": []}
        try:
            base = G.make_flint(inp)
        except G.Unavailable as e:
            sw["error"] = str(e)
            return sw
        if default_us is None:  # flint not in --impls: time the default (env unset) here
            r = {}
            if self.measure(base, r, refs, n_calls):
                sw["default_us"] = r["us"]
        if self.args.sweep_configs:
            cands = [grid.parse_config(c) for c in self.args.sweep_configs.split(";") if c.strip()]
        else:
            cands = grid.sweep_candidates(row, self.sms, self.args.sweep_limit)
        log(f"  sweep: {len(cands)} configs (default {sw['default']})")
        for cfg in cands:
            c = {"config": grid.format_config(cfg)}
            self.measure(G.flint_with_config(base, cfg), c, refs, n_calls, rejectable=True)
            sw["candidates"].append(c)
        ok = [c for c in sw["candidates"] if c.get("us")]
        if ok:
            sw["best"] = min(ok, key=lambda c: c["us"])
            b, d = sw["best"], sw["default_us"]
            log(f"  sweep best {b['config']}: {b['us']:.2f} µs"
                + (f" vs default {d:.2f} µs ({d / b['us']:.2f}x)" if d else ""))
        return sw


def gpu_run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_decode.py needs a CUDA GPU (an H200); without one, use --dry-run.")
    import bench_gpu as G

    if G.FLINT_ENV in os.environ:
        log(f"warning: {G.FLINT_ENV}={os.environ[G.FLINT_ENV]} is set in the environment: unset for "
            "this run (default timings must use the default config); use --config instead")
        os.environ.pop(G.FLINT_ENV)
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    l2 = getattr(props, "L2_cache_size", 0) or grid.L2_BYTES_DEFAULT
    target = _target_bytes(args, l2)
    if torch.cuda.get_device_capability(0) != (9, 0):
        log(f"warning: {props.name} is not SM90: Flint and XQA target Hopper")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out_dir)
    json_path, png_path = _paths(args, stamp, out_dir)
    fi_version = None
    if {"xqa", "fa2"} & set(args.impl_list):
        try:
            fi_version = G.import_flashinfer().__version__
            log(f"flashinfer {fi_version} (XQA JIT-compiles on first use, cache "
                f"{os.environ['FLASHINFER_WORKSPACE_BASE']})")
        except G.Unavailable as e:
            log(f"flashinfer missing: {e}")
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": f"{props.name} ({sms} SMs, L2 {l2 / 1e6:.0f} MB)", "sms": sms, "l2_bytes": l2,
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version,
        "flashinfer": fi_version, "commit": _git_commit(), "method": _method(args, target),
        "rotation_target_bytes": target, "argv": sys.argv[1:],
    }
    log(f"{meta['gpu']}, torch {meta['torch']}, commit {meta['commit']}")
    t_start = time.time()
    if args.ceiling:
        ceiling = {"tbps": args.ceiling, "kernel": "given by --ceiling", "bytes": 0}
    else:
        log(f"measuring the HBM read ceiling ({args.ceiling_gib} GiB)")
        ceiling = G.measure_ceiling(args.ceiling_gib, log)
    log(report.ceiling_line(ceiling))
    runner = Runner(args, G, torch, ceiling["tbps"], sms, target)
    results = []
    for row in args.row_list:
        t0 = time.time()
        try:
            results.append(runner.run_row(row))
        except Exception as e:  # noqa: BLE001 (keep what was measured)
            msg = f"{row.name}: {type(e).__name__}: {_oneline(str(e), 1000)}"
            log(f"[{row.name}] failed: {msg}")
            meta.setdefault("failed_rows", []).append(msg)
            if _is_fatal(e):
                meta["aborted"] = msg
                log("CUDA context is broken: stopping here")
                break
            gc.collect()
            torch.cuda.empty_cache()
        finally:
            log(f"[{row.name}] {time.time() - t0:.1f} s")
        report.write_json(json_path, meta, ceiling, results)
    meta["wall_s"] = round(time.time() - t_start, 1)
    _final_report(args, meta, ceiling, results, json_path, png_path)
    return 0 if "aborted" not in meta else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list_rows:
        for r in grid.default_grid():
            _emit(f"{r.name:18s} {r.describe()}" + ("  (quick)" if r.name in grid.QUICK_ROWS else ""))
        return 0
    if args.dry_run:
        return dry_run(args)
    return gpu_run(args)


if __name__ == "__main__":
    sys.exit(main())
