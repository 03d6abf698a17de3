"""Calls the operator on one benchmark row, eagerly, rotating over input sets
larger than L2: the workload for a profiler on the benchmark's rows (ncu_row.py,
device_run.sh's ncu step, does the same for quick_ab's rows and the plans).

    ncu --set full -k regex:decode_attention -s 20 -c 1 \
        python tools/profile_row.py --row b1_l1k [--impl flint-split] [--row srv_b32_logu32k_fp8]

ncu serializes kernels, so a profiled launch never overlaps the one before
it (no PDL overlap): profiles show a call's own time, not a chain's. Serving
rows (srv_*) allocate the shared pool (--pool-gib).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository's packages import as under `python -m`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__":
    from benchmarks import checkout

    checkout.use_this_checkout()

import torch  # noqa: E402

from benchmarks import bench_gpu as G  # noqa: E402
from benchmarks import bench_grid as grid  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row", required=True, help="a benchmark row name, e.g. b1_l1k or srv_b8_logu16k_fp8")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--impl", choices=("flint", "flint-split", "flint-balanced"), default="flint")
    p.add_argument("--pool-gib", type=float, default=24.0)
    p.add_argument("--device", default="cuda", help="cpu: the same calls on the CPU path (a check)")
    args = p.parse_args()
    rows = grid.select_rows(args.row, kv_dtypes=("bf16",) if not args.row.endswith("_fp8") else ("fp8",))
    row = rows[0]
    base = row.as_dtype("bf16")
    n_sets = grid.num_sets(row, 2 * grid.L2_BYTES_DEFAULT)
    shared = (G.SharedPools(int(args.pool_gib * 2**30), args.device, 0, row.kv_dtype == "fp8")
              if row.placement == "pool" else None)
    inp = G.build_inputs(base, {row.kv_dtype: n_sets}, shared, seed=1, device=args.device)
    make = {"flint": G.make_flint, "flint-split": G.make_flint_split, "flint-balanced": G.make_flint_balanced}
    impl = make[args.impl](inp, row.kv_dtype)
    for i in range(args.calls):
        impl.fns[i % len(impl.fns)]()
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(f"{row.name} ({args.impl}{', ' + impl.note if impl.note else ''}): {args.calls} calls over "
          f"{n_sets} input sets")


if __name__ == "__main__":
    main()
