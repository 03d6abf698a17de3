"""Reporting for the decode benchmark, on plain dicts (no GPU needed): the
compact and full Markdown tables, the rows' lengths, the RESULTS.md block,
JSON and the plot. Also a command line that re-renders a saved run:

    python benchmarks/bench_report.py --plot results/bench_X.json --out docs/performance.png
    python benchmarks/bench_report.py --table results/bench_X.json

A row result is a dict: row, kv_dtype, twin (the bf16 row's name), batch,
kv_heads, gqa, head_dim, sinks, q_tokens (the shape; runs before the models'
rows have none: G 8, D 128, sinks; before the spec rows no q_tokens: 1),
seq_len (the longest), window, lengths {count, padding, min, median,
max, attended_tokens, attended_pages}, kv_bytes, floor_us (at the measured
ceiling), goal_us / stretch_us (at 4.5 TB/s), n_sets, n_calls,
balance {impl: {plan, max_pages, mean_pages, ratio} or {error}}, and impls:
{name: {status ("ok", "missing", "mismatch", "error", "unchecked",
"skipped"), us, tbps, pct, err, max_abs, probe_err (rows of q_tokens > 1:
the draft probe's), note, reason}}. Runs recorded before
the serving rows (no kv_dtype, lengths or goals) read as bf16 rows with goals
computed from their KV bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FLINT = "flint"
SPLIT = "flint-split"  # the split kernels' plan forced (an A/B)
XQA = "fi-xqa"
VLLM = "vllm-triton"
SDPA = "sdpa"
PREFERRED = (FLINT, SPLIT, XQA, VLLM, SDPA)
PEERS = (XQA, VLLM, SDPA)  # the targets compare flint with XQA and vLLM (SDPA: context)
GOAL_TBPS = 4.5
GOAL = (0.93, 3.0)
STRETCH = (0.95, 2.0)


def goal_us(kv_bytes: int, rule=GOAL, tbps: float = GOAL_TBPS) -> float:
    eff, add = rule
    return kv_bytes / (tbps * 1e12) * 1e6 / eff + add


def fill_rates(res: dict, ceiling_tbps: float) -> None:
    """TB/s and % of the ceiling from µs and the row's KV bytes."""
    for r in res["impls"].values():
        us = r.get("us")
        if us:
            r["tbps"] = res["kv_bytes"] / (us * 1e-6) / 1e12
            r["pct"] = 100.0 * r["tbps"] / ceiling_tbps
            if r.get("eager_us"):
                r["eager_tbps"] = res["kv_bytes"] / (r["eager_us"] * 1e-6) / 1e12


def normalize(results: list[dict]) -> list[dict]:
    """Fills what older runs' rows lack (kv dtype, twin, goals) in place."""
    for res in results:
        res.setdefault("kv_dtype", "bf16")
        res.setdefault("twin", res["row"][:-4] if res["row"].endswith("_fp8") else res["row"])
        res.setdefault("goal_us", goal_us(res["kv_bytes"]))
        res.setdefault("stretch_us", goal_us(res["kv_bytes"], STRETCH))
        res.setdefault("balance", {})
        res.setdefault("impls", {})
    return results


def annotate(results: list[dict]) -> list[dict]:
    """Adds to every fp8 row ``fp8_bf16`` {impl: fp8 µs / bf16 µs} from its
    bf16 twin in the same run."""
    normalize(results)
    by_name = {r["row"]: r for r in results}
    for res in results:
        twin = by_name.get(res["twin"]) if res["kv_dtype"] == "fp8" else None
        if twin is None:
            continue
        ratios = {}
        for n, r in res["impls"].items():
            a, b = r.get("us"), twin["impls"].get(n, {}).get("us")
            if a and b:
                ratios[n] = a / b
        res["fp8_bf16"] = ratios
    return results


def impl_order(results: list[dict]) -> list[str]:
    names: list[str] = []
    for res in results:
        for n in res["impls"]:
            if n not in names:
                names.append(n)
    return sorted(names, key=lambda n: (PREFERRED.index(n) if n in PREFERRED else len(PREFERRED),
                                        names.index(n)))


def _us(x: float) -> str:
    return f"{x:.2f}" if x < 10 else (f"{x:.1f}" if x < 1000 else f"{x:.0f}")


def _win(w) -> str:
    return str(w) if w else "—"


def shape(res: dict) -> str:
    """G (query heads per kv head), D, sinks and query tokens of a row:
    "G8 D128 s" ("s": sinks), "G8 D128 s Q4" (4 query tokens per request);
    rows of older runs are G 8, D 128 with sinks, one query token."""
    q = res.get("q_tokens", 1)
    return (f"G{res.get('gqa', 8)} D{res.get('head_dim', 128)}" + (" s" if res.get("sinks", True) else "")
            + (f" Q{q}" if q > 1 else ""))


def _t(res: dict, impl: str):
    return res["impls"].get(impl, {}).get("us")


def _short(r: dict | None) -> str:
    """A peer's cell: µs, or its status."""
    if r is None:
        return ""
    if r.get("us") is None:
        return r.get("status", "missing")
    return _us(r["us"]) + ("*" if r.get("status") == "unchecked" else "")


def _lengths(res: dict) -> str:
    lens = res.get("lengths")
    if not lens:
        return f"{res['batch']} x {res['seq_len']}"
    pad = f"+{lens['padding']}p" if lens["padding"] else ""
    if lens["min"] == lens["max"]:
        return f"{lens['count'] - lens['padding']}{pad} x {lens['max']}"
    return f"{lens['count'] - lens['padding']}{pad}: {lens['min']}/{lens['median']:g}/{lens['max']}"


def _balance(res: dict, impl: str = FLINT) -> str:
    b = res.get("balance", {}).get(impl)
    if not b:
        return ""
    if "error" in b:
        return "n/a"
    return f"{b['ratio']:.2f} ({b['max_pages']}/{b['mean_pages']:.1f})" if b.get("ratio") else "—"


def verdict(res: dict) -> dict:
    """Goal, stretch and peers of one row: {"goal": bool|None, "stretch": ...,
    "slower_than": [peers faster than flint]} (None: flint has no time)."""
    f = _t(res, FLINT)
    if f is None:
        return {"goal": None, "stretch": None, "slower_than": []}
    slower = [p for p in (XQA, VLLM) if _t(res, p) is not None and _t(res, p) <= f]
    return {"goal": f <= res["goal_us"], "stretch": f <= res["stretch_us"], "slower_than": slower}


def compact_table(results: list[dict]) -> str:
    """One line per row: row | Flint µs | TB/s | % ceil | goal | met? |
    balance | split | XQA | vLLM-triton | fp8/bf16."""
    annotate(results)
    head = ["row", "lengths", "flint µs", "TB/s", "% ceil", "goal µs", "met?", "balance",
            "split µs", "XQA µs", "vLLM-triton µs", "fp8/bf16"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        fr = res["impls"].get(FLINT, {})
        v = verdict(res)
        if v["goal"] is None:
            met = ""
        else:
            met = ("yes" if v["goal"] else f"NO +{_us(fr['us'] - res['goal_us'])}") + \
                  (" (stretch)" if v["stretch"] else "")
            if v["slower_than"]:
                met += "; slower than " + ", ".join(v["slower_than"])
        ratio = res.get("fp8_bf16", {}).get(FLINT)
        cells = [res["row"], _lengths(res),
                 _short(fr) if fr else "", f"{fr['tbps']:.2f}" if fr.get("tbps") else "",
                 f"{fr['pct']:.0f}%" if fr.get("pct") else "", _us(res["goal_us"]), met,
                 _balance(res), _short(res["impls"].get(SPLIT)), _short(res["impls"].get(XQA)),
                 _short(res["impls"].get(VLLM)), f"{ratio:.2f}" if ratio else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(results: list[dict]) -> list[str]:
    """How many rows meet the goal, the stretch, and beat the peers, per dtype."""
    out = []
    for dtype in ("bf16", "fp8"):
        rows = [r for r in results if r["kv_dtype"] == dtype]
        if not rows:
            continue
        timed = [r for r in rows if _t(r, FLINT) is not None]
        v = [verdict(r) for r in timed]
        goal = sum(x["goal"] for x in v)
        stretch = sum(x["stretch"] for x in v)
        line = (f"- {dtype}: flint timed on {len(timed)} of {len(rows)} rows; goal (floor at "
                f"{GOAL_TBPS} TB/s / 0.93 + 3 µs) met on {goal}, stretch (/ 0.95 + 2) on {stretch}")
        for p in (XQA, VLLM):
            both = [r for r in timed if _t(r, p) is not None]
            if both:
                faster = sum(_t(r, FLINT) < _t(r, p) for r in both)
                ratios = [_t(r, p) / _t(r, FLINT) for r in both]
                line += (f"; faster than {p} on {faster} of {len(both)} "
                         f"({min(ratios):.2f}x to {max(ratios):.2f}x)")
        out.append(line)
    return out


def _cell(r: dict | None) -> list[str]:
    if r is None:
        return ["", "", ""]
    if r.get("us") is None:
        return [r.get("status", "missing"), "—", "—"]
    mark = "*" if r.get("status") == "unchecked" else ""
    return [_us(r["us"]) + mark, f"{r['tbps']:.2f}", f"{r['pct']:.0f}%"]


def markdown_table(results: list[dict]) -> str:
    """Every implementation's µs, TB/s and % of the ceiling, and flint's
    speed-up against each peer."""
    normalize(results)
    impls = impl_order(results)
    peers = [n for n in impls if n != FLINT]
    head = ["row", "kvH", "shape", "lengths", "win", "KV MB", "floor µs", "goal µs"]
    for n in impls:
        head += [f"{n} µs", "TB/s", "% ceil"]
    has_flint = FLINT in impls
    if has_flint:
        head += [f"flint vs {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        cells = [res["row"], str(res["kv_heads"]), shape(res), _lengths(res), _win(res["window"]),
                 f"{res['kv_bytes'] / 1e6:.1f}", _us(res["floor_us"]), _us(res["goal_us"])]
        for n in impls:
            cells += _cell(res["impls"].get(n))
        if has_flint:
            f = _t(res, FLINT)
            for p in peers:
                pu = _t(res, p)
                cells.append(f"{pu / f:.2f}×" if f and pu else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lengths_table(rows: list[dict]) -> str:
    """Each row's shape and lengths (rows as dicts with name, kv_heads,
    gqa, head_dim, sinks, window, table_width, placement, spec, lengths)."""
    head = ["row", "kvH", "shape", "win", "table", "placement", "requests", "padding", "min", "median",
            "max", "attended pages", "lengths drawn as"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s = r["lengths"]
        lines.append("| " + " | ".join([
            r["row"], str(r["kv_heads"]), shape(r), _win(r["window"]), str(r.get("table_width", "")),
            r.get("placement", ""), str(s["count"] - s["padding"]), str(s["padding"]), str(s["min"]),
            f"{s['median']:g}", str(s["max"]), str(s["attended_pages"]), r.get("spec") or "uniform"]) + " |")
    return "\n".join(lines)


SPEEDUP_LEGEND = ("flint vs P = P µs / flint µs (> 1: flint is faster); * = output not checked; "
                  "shape = G query heads per kv head, head dim D, s = sinks, Q = query tokens per request; "
                  "goal = floor at 4.5 TB/s / 0.93 + 3 µs, stretch = / 0.95 + 2 µs; balance = the "
                  "slowest CTA's pages / the mean (pages), from flint's default plan")


def notes(results: list[dict]) -> list[str]:
    """Implementation notes, then every missing / failed cell, the same
    reason on several rows said once."""
    out, seen = [f"- {SPEEDUP_LEGEND}"], set()
    for res in results:
        for n, r in res["impls"].items():
            if r.get("note") and (n, r["note"]) not in seen:
                seen.add((n, r["note"]))
                out.append(f"- {n}: {r['note']}")
    grouped: dict = {}
    for res in results:
        for n, r in res["impls"].items():
            if r.get("status") in ("missing", "mismatch", "error", "skipped"):
                reason = r.get("reason", "")
                reason = reason if len(reason) <= 300 else reason[:300] + " … (full text in the JSON)"
                grouped.setdefault((n, r["status"], reason), []).append(res["row"])
            elif r.get("status") == "unchecked":
                grouped.setdefault((n, "unchecked", "* output not checked (--no-check)"), []).append(res["row"])
    for (n, status, reason), rows in grouped.items():
        where = ", ".join(rows) if len(rows) <= 4 else f"{len(rows)} rows ({rows[0]} … {rows[-1]})"
        out.append(f"- {n} {status} on {where}: {reason}")
    for res in results:
        for n, b in res.get("balance", {}).items():
            if "error" in b and (n, b["error"]) not in seen:
                seen.add((n, b["error"]))
                out.append(f"- balance ({n}): {b['error']}")
    return out


def eager_table(results: list[dict]) -> str | None:
    impls = impl_order(results)
    if not any(r.get("eager_us") for res in results for r in res["impls"].values()):
        return None
    head = ["row"]
    for n in impls:
        head += [f"{n} graph µs", "eager µs", "overhead µs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        cells = [res["row"]]
        for n in impls:
            r = res["impls"].get(n, {})
            g, e = r.get("us"), r.get("eager_us")
            cells += [_us(g) if g else "—", _us(e) if e else "—", _us(e - g) if g and e else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ceiling_line(ceiling: dict) -> str:
    gib = ceiling.get("bytes", 0) / 2**30
    src = ceiling.get("kernel", "?")
    return (f"HBM read ceiling: {ceiling['tbps']:.3f} TB/s "
            f"(best plain streaming read of {gib:.1f} GiB: {src})")


def results_block(meta: dict, ceiling: dict, results: list[dict]) -> str:
    lines = [
        f"## {meta['date']} — {meta['gpu']}",
        "",
        f"- torch {meta['torch']}, CUDA {meta.get('cuda')}, FlashInfer {meta.get('flashinfer') or 'n/a'}, "
        f"vLLM Triton {meta.get('vllm_triton') or 'n/a'}, commit `{meta.get('commit') or 'unknown'}`",
        f"- {ceiling_line(ceiling)}",
        f"- {meta['method']}",
        "",
        compact_table(results),
        "",
        *summary_lines(results),
        "",
        markdown_table(results),
        "",
        *notes(results),
        *(f"- row failed: {m}" for m in meta.get("failed_rows", [])),
        *(f"- {m}" for m in meta.get("skipped", [])),
    ]
    return "\n".join(lines)


def write_json(path: Path, meta: dict, ceiling: dict, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "ceiling": ceiling, "rows": results}, indent=1))
    tmp.replace(path)


def load_json(path: Path) -> tuple[dict, dict, list[dict]]:
    d = json.loads(Path(path).read_text())
    return d.get("meta", {}), d.get("ceiling", {}), annotate(d.get("rows", []))


def plot(path: Path, ceiling: dict, results: list[dict], title: str | None = None) -> str:
    """Horizontal bars per row: each implementation's share of the HBM read
    ceiling (attended KV bytes / time), with the goal's share as a tick; bf16
    and fp8 rows side by side when both ran. Returns a message."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no plot"
    annotate(results)
    top = ceiling["tbps"]
    dtypes = [d for d in ("bf16", "fp8") if any(r["kv_dtype"] == d for r in results)]
    names = []
    for r in results:
        if r["twin"] not in names:
            names.append(r["twin"])
    impls = [n for n in impl_order(results) if any(_t(r, n) for r in results)]
    colors = {FLINT: "#d62728", SPLIT: "#ff9896", XQA: "#1f77b4", VLLM: "#2ca02c", SDPA: "#7f7f7f"}
    by = {(r["twin"], r["kv_dtype"]): r for r in results}
    n_rows = len(names)
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes) + 2.5, 0.42 * n_rows * max(1, len(impls) / 3) + 1.6),
                             sharey=True, squeeze=False)
    bar = 0.8 / max(1, len(impls))
    for ax, dtype in zip(axes[0], dtypes):
        for j, n in enumerate(impls):
            ys, xs, ts = [], [], []
            for i, name in enumerate(names):
                r = by.get((name, dtype))
                t = _t(r, n) if r else None
                if t:
                    ys.append(i + (j - (len(impls) - 1) / 2) * bar)
                    xs.append(100.0 * r["kv_bytes"] / (t * 1e-6) / 1e12 / top)
                    ts.append(t)
            ax.barh(ys, xs, height=bar, color=colors.get(n), label=n)
            for y, x, t in zip(ys, xs, ts):  # µs at the end of every bar
                ax.text(x + 0.8, y, f"{_us(t)} µs", va="center", fontsize=5.5,
                        fontweight="bold" if n == FLINT else "normal")
        gy, gx = [], []
        for i, name in enumerate(names):
            r = by.get((name, dtype))
            if r:
                gy.append(i)
                gx.append(100.0 * r["kv_bytes"] / (r["goal_us"] * 1e-6) / 1e12 / top)
        ax.scatter(gx, gy, marker="|", s=200, color="k", zorder=3, label="goal (floor 4.5 TB/s / 0.93 + 3 µs)")
        ax.set_title(f"{dtype} KV cache", fontsize=10)
        ax.set_xlabel(f"% of the HBM read ceiling ({top:.2f} TB/s): attended KV bytes / time")
        ax.set_xlim(0, 118)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(n_rows))
    axes[0][0].set_yticklabels(names, fontsize=7)
    axes[0][0].invert_yaxis()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.suptitle(title or "Flint paged decode attention vs peers (longer bar = faster)", fontsize=11,
                 y=0.995)
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8,
               bbox_to_anchor=(0.5, 0.965), frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return f"plot: {path}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Re-render a saved benchmark run (no GPU needed).")
    p.add_argument("--plot", metavar="JSON", help="render this run's plot")
    p.add_argument("--out", help="PNG path for --plot (default: beside the JSON)")
    p.add_argument("--title", help="plot title")
    p.add_argument("--table", metavar="JSON", help="print this run's tables")
    args = p.parse_args(argv)
    if not args.plot and not args.table:
        p.error("give --plot JSON and/or --table JSON")
    if args.table:
        meta, ceiling, results = load_json(args.table)
        print(results_block(meta, ceiling, results))
    if args.plot:
        meta, ceiling, results = load_json(args.plot)
        out = Path(args.out) if args.out else Path(args.plot).with_suffix(".png")
        title = args.title or (f"Flint vs peers, {meta.get('gpu', '?')}, commit {meta.get('commit', '?')} "
                               f"({meta.get('date', '')}); longer bar = faster")
        print(plot(out, ceiling, results, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
