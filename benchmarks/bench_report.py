"""Reporting for the decode benchmark, on plain dicts (no GPU needed): the
Markdown table, eager and sweep tables, the RESULTS.md block, JSON and the
bandwidth plot.

A row result is a dict: row, batch, kv_heads, seq_len, window, kv_bytes,
qo_bytes, floor_us, n_sets, n_calls, and impls: {name: {status ("ok",
"missing", "mismatch", "error", "unchecked"), us, tbps, pct, eager_us, err,
note, reason}}; optionally sweep: {default, candidates: [...], best}.
"""

from __future__ import annotations

import json
from pathlib import Path

FLINT = "flint"


def fill_rates(res: dict, ceiling_tbps: float) -> None:
    """TB/s and % of the ceiling from µs and the row's KV bytes."""
    for r in res["impls"].values():
        us = r.get("us")
        if us:
            r["tbps"] = res["kv_bytes"] / (us * 1e-6) / 1e12
            r["pct"] = 100.0 * r["tbps"] / ceiling_tbps
            if r.get("eager_us"):
                r["eager_tbps"] = res["kv_bytes"] / (r["eager_us"] * 1e-6) / 1e12


def impl_order(results: list[dict]) -> list[str]:
    names: list[str] = []
    for res in results:
        for n in res["impls"]:
            if n not in names:
                names.append(n)
    # flint (and its override) first, peers after in first-seen order
    return sorted(names, key=lambda n: (not n.startswith(FLINT), names.index(n)))


def _us(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _win(w) -> str:
    return str(w) if w else "—"


def _cell(r: dict | None) -> list[str]:
    if r is None:
        return ["", "", ""]
    if r.get("us") is None:
        return [r.get("status", "missing"), "—", "—"]
    mark = "*" if r.get("status") == "unchecked" else ""
    return [_us(r["us"]) + mark, f"{r['tbps']:.2f}", f"{r['pct']:.0f}%"]


def markdown_table(results: list[dict]) -> str:
    impls = impl_order(results)
    peers = [n for n in impls if not n.startswith(FLINT)]
    head = ["row", "B", "kvH", "L", "win", "KV MB", "floor µs"]
    for n in impls:
        head += [f"{n} µs", "TB/s", "% ceil"]
    has_flint = FLINT in impls
    if has_flint:
        head += [f"flint vs {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        cells = [res["row"], str(res["batch"]), str(res["kv_heads"]), str(res["seq_len"]),
                 _win(res["window"]), f"{res['kv_bytes'] / 1e6:.1f}", _us(res["floor_us"])]
        for n in impls:
            cells += _cell(res["impls"].get(n))
        if has_flint:
            f = res["impls"].get(FLINT, {}).get("us")
            for p in peers:
                pu = res["impls"].get(p, {}).get("us")
                cells.append(f"{pu / f:.2f}×" if f and pu else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


SPEEDUP_LEGEND = "flint vs P = P µs / flint µs (> 1: flint is faster); * = output not checked"


def notes(results: list[dict]) -> list[str]:
    """One line per implementation note and per missing / failed cell."""
    out, seen = [f"- {SPEEDUP_LEGEND}"], set()
    for res in results:
        for n, r in res["impls"].items():
            if r.get("note") and (n, r["note"]) not in seen:
                seen.add((n, r["note"]))
                out.append(f"- {n}: {r['note']}")
    for res in results:
        for n, r in res["impls"].items():
            if r.get("status") in ("missing", "mismatch", "error"):
                reason = r.get("reason", "")
                reason = reason if len(reason) <= 300 else reason[:300] + " … (full text in the JSON)"
                out.append(f"- {res['row']} / {n}: {r['status']}: {reason}")
            elif r.get("status") == "unchecked":
                out.append(f"- {res['row']} / {n}: * output not checked (--no-check)")
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


def sweep_report(res: dict, ceiling_tbps: float, top: int = 10) -> str:
    sw = res["sweep"]
    ok = sorted((c for c in sw["candidates"] if c.get("us")), key=lambda c: c["us"])
    skipped = [c for c in sw["candidates"] if not c.get("us")]
    d = sw.get("default_us")
    lines = [f"### sweep {res['row']} ({len(ok)} timed, {len(skipped)} skipped; "
             f"default {sw['default']} → {_us(d) + ' µs' if d else 'n/a'})",
             "| config | µs | TB/s | % ceil | vs default |", "|---|---|---|---|---|"]
    for c in ok[:top]:
        tbps = res["kv_bytes"] / (c["us"] * 1e-6) / 1e12
        vs = f"{d / c['us']:.2f}×" if d else "—"
        lines.append(f"| {c['config']} | {_us(c['us'])} | {tbps:.2f} | "
                     f"{100 * tbps / ceiling_tbps:.0f}% | {vs} |")
    if sw.get("best"):
        b = sw["best"]
        vs = f" ({d / b['us']:.2f}× vs default)" if d else ""
        lines.append(f"\nbest {res['row']}: {b['config']} {_us(b['us'])} µs{vs}")
    reasons = {}
    for c in skipped:
        reasons.setdefault(c.get("status", "skipped"), []).append(c["config"])
    for st, cfgs in reasons.items():
        lines.append(f"{st}: {' '.join(cfgs)}")
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
        f"commit `{meta.get('commit') or 'unknown'}`",
        f"- {ceiling_line(ceiling)}",
        f"- {meta['method']}",
        "",
        markdown_table(results),
        "",
        *notes(results),
        *(f"- row failed: {m}" for m in meta.get("failed_rows", [])),
    ]
    return "\n".join(lines)


def write_json(path: Path, meta: dict, ceiling: dict, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "ceiling": ceiling, "rows": results}, indent=1))
    tmp.replace(path)


def plot(path: Path, ceiling: dict, results: list[dict]) -> str:
    """Achieved TB/s against KV bytes per implementation (log x), the ceiling
    as a horizontal line. Returns a message."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no plot"
    fig, ax = plt.subplots(figsize=(10, 6))
    markers = "os^vD<>Px"
    top = ceiling["tbps"]
    for i, n in enumerate(impl_order(results)):
        pts = [(res["kv_bytes"], res["impls"][n]["tbps"], res["row"]) for res in results
               if res["impls"].get(n, {}).get("tbps")]
        if not pts:
            continue
        pts.sort()
        top = max(top, max(p[1] for p in pts))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                linestyle="", label=n)
        if n == FLINT:
            seen: dict = {}
            for x, y, name in pts:
                k = seen[x] = seen.get(x, -1) + 1  # stagger labels of rows with equal bytes
                ax.annotate(name, (x, y), fontsize=6, xytext=(3, 3 + 7 * k), textcoords="offset points")
    ax.axhline(ceiling["tbps"], color="k", linestyle="--", linewidth=1,
               label=f"HBM read ceiling {ceiling['tbps']:.2f} TB/s")
    ax.set_xscale("log")
    ax.set_xlabel("attended KV bytes per call")
    ax.set_ylabel("achieved TB/s (KV bytes / time)")
    ax.set_ylim(0, top * 1.1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Flint paged decode attention: bandwidth vs KV bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return f"plot: {path}"
