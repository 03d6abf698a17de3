"""Warp-stall samples per instruction from an Nsight Compute report's source
page (`ncu -i R --page source --csv --print-source ...`), for the device_run
step `ncusrc`: the sampled columns' totals, the instructions with the most
samples (and their nonzero sampled columns), and the samples summed per CUDA
source line where the page carries one.

    python benchmarks/ncu_source.py PAGE.csv [TOP]
"""

import csv
import re
import sys
from collections import defaultdict


def number(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return None


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rows = list(csv.reader(open(path, newline="", errors="replace")))
    head_i = next((i for i, r in enumerate(rows) if any("Address" in c or "Source" == c.strip('# ') for c in r)), None)
    if head_i is None:
        print("no header found; first lines:", *rows[:5], sep="\n")
        return
    head = rows[head_i]
    body = [r for r in rows[head_i + 1:] if len(r) == len(head)]
    print("columns:", head)
    src_col = next((i for i, c in enumerate(head) if c.strip("# ") == "Source"), None)
    addr_col = next((i for i, c in enumerate(head) if "Address" in c), None)
    numeric = [i for i in range(len(head)) if i not in (src_col, addr_col)
               and sum(number(r[i]) is not None for r in body) > len(body) // 2]
    samp = [i for i in numeric if "Sampl" in head[i] or "stall" in head[i].lower()]
    main_col = next((i for i in samp if "All Samples" in head[i]), samp[0] if samp else None)
    print("rows", len(body), "sampled columns:", [head[i] for i in samp])
    for i in samp:
        print(f"  total {head[i]}: {sum(number(r[i]) or 0 for r in body):.0f}")
    if main_col is None:
        return
    ranked = sorted(body, key=lambda r: -(number(r[main_col]) or 0))[:top]
    print(f"\ntop {top} by {head[main_col]}:")
    for r in ranked:
        extra = ", ".join(f"{head[i]}={r[i]}" for i in numeric
                          if i != main_col and (number(r[i]) or 0) != 0)[:400]
        print(f"{r[addr_col] if addr_col is not None else '?'} {r[main_col]:>8} | "
              f"{r[src_col][:70] if src_col is not None else ''} | {extra}")
    # CUDA lines (cuda,sass pages interleave source lines; file:line tags vary): sum by
    # the latest source-looking row.
    by_line = defaultdict(float)
    cur = None
    for r in body:
        s = r[src_col] if src_col is not None else ""
        if addr_col is not None and not re.match(r"^\s*(0x)?[0-9a-fA-F]+\s*$", r[addr_col] or ""):
            cur = s.strip()[:90]
            continue
        by_line[cur] += number(r[main_col]) or 0
    if len(by_line) > 1:
        print("\nby source line (top):")
        for k, v in sorted(by_line.items(), key=lambda kv: -kv[1])[:top]:
            print(f"{v:8.0f}  {k}")


if __name__ == "__main__":
    main()
