"""Summarizes the comparison log that the tests write with FLINT_ERROR_LOG=path
(tests/conftest.py): per kind of comparison, the worst relative Frobenius
error, the worst absolute error and the largest fraction of the per-coordinate
bound used, with the test that hit it. This is how GPU_VS_CPU is measured.

    python tools/error_summary.py errors.jsonl
"""

import json
import sys


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    print("| comparison | checks | max rel Frobenius | max abs | max bound used | worst test |")
    print("|---|---|---|---|---|---|")
    for kind in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == kind]
        worst = max(rs, key=lambda r: r["bound_used"])
        print(f"| {kind} | {len(rs)} | {max(r['rel_fro'] for r in rs):.3e} | "
              f"{max(r['max_abs'] for r in rs):.3e} | {worst['bound_used']:.2f} | {worst['test']} |")


if __name__ == "__main__":
    main(sys.argv[1])
