"""Warp-stall samples per CUDA source line from an Nsight Compute report's
source page, for the device_run step `ncusrc`:

    ncu -i R.ncu-rep --page source --csv --print-source cuda,sass > R.csv
    python tools/ncu_source.py R.csv [TOP] [FILE:FIRST-LAST ...]

The page has one section per source file ("File Path" row, then a "Line No"
header); each CUDA line's row carries the samples of its SASS instructions,
which follow it with an empty line number. Only the line rows are summed
(the SASS rows would count every sample twice). Prints the stall reasons'
shares over the kernel, the TOP lines (default 40) by samples with their
main reasons, and the samples within each FILE:FIRST-LAST range.
"""

import csv
import gzip
import sys
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def number(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def source_lines(path):
    """(file name, line number, source text, {column: value}) for every CUDA line row."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="", errors="replace") as f:
        name, head = None, None
        for r in csv.reader(f):
            if len(r) == 2 and r[0] == "File Path":
                name = r[1].rsplit("/", 1)[-1]
            elif r and r[0] == "Line No":
                head = r
            elif head and len(r) == len(head) and r[0]:
                # columns 0-1: the line's number and text; 2-3: a SASS row's address and text
                yield name, int(r[0]), r[1], dict(zip(head[4:], r[4:]))


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    lines = list(source_lines(path))
    if not lines:
        print("no source lines: not a --print-source cuda,sass page?")
        return
    stalls = [c for c in lines[0][3] if c.startswith("stall_") and "Not Issued" not in c]
    by_reason = Counter()
    for *_, d in lines:
        for c in stalls:
            by_reason[c] += number(d[c])
    total = sum(by_reason.values())
    print(f"samples {total:.0f}: " + ", ".join(
        f"{c[6:]} {100 * v / total:.1f}%" for c, v in by_reason.most_common(10)))

    def reasons(d):
        return " ".join(f"{c[6:]}={number(d[c]):.0f}"
                        for c in sorted(stalls, key=lambda c: -number(d[c]))[:4] if number(d[c]))

    print(f"\ntop {top} lines by samples:")
    for name, line, text, d in sorted(lines, key=lambda x: -number(x[3][SAMPLES]))[:top]:
        print(f"{number(d[SAMPLES]):7.0f} {name}:{line} {text.strip()[:60]!r} "
              f"executed={d['Instructions Executed']} {reasons(d)}")
    for spec in sys.argv[3:]:
        name, span = spec.rsplit(":", 1)
        first, last = map(int, span.split("-"))
        inside = [x for x in lines if x[0] == name and first <= x[1] <= last]
        print(f"\n{spec}: {sum(number(d[SAMPLES]) for *_, d in inside):.0f} samples")
        for _, line, text, d in inside:
            if number(d[SAMPLES]) >= 5:
                print(f"{number(d[SAMPLES]):7.0f} {line} {text.strip()[:60]!r} {reasons(d)}")


if __name__ == "__main__":
    main()
