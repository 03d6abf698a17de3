"""Calls the operator on one benchmark row, eagerly, rotating over input sets
larger than L2: the workload for a profiler (device_check.sh's ncu step).

    ncu --set full -k regex:decode_attention -s 20 -c 1 \
        python benchmarks/profile_row.py --row b1_l1k [--config 16,8,2,1,0]

ncu serializes kernels, so a profiled launch never overlaps the one before
it (no PDL overlap): profiles show a call's own time, not a chain's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_grid as grid  # noqa: E402
import bench_gpu as G  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row", required=True, help="a benchmark row name, e.g. b1_l1k")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--config", help="FLINT_LAUNCH_CONFIG (default: the heuristic's)")
    args = p.parse_args()
    if args.config:
        os.environ[G.FLINT_ENV] = grid.format_config(grid.parse_config(args.config))
    op = G.import_flint()
    (row,) = grid.select_rows(args.row, False)
    n_sets = grid.num_sets(row, 2 * grid.L2_BYTES_DEFAULT)
    inp = G.make_inputs(row, n_sets, seed=1, device="cuda")
    outs = [torch.empty_like(s.q) for s in inp.sets]
    for i in range(args.calls):
        s = inp.sets[i % n_sets]
        op(s.q, s.kv, s.block_tables, inp.seq_lens, inp.sinks, row.window, grid.SCALE,
           outs[i % n_sets])
    torch.cuda.synchronize()
    print(f"{row.name}: {args.calls} calls over {n_sets} input sets")


if __name__ == "__main__":
    main()
