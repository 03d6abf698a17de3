"""One row's calls for Nsight Compute: 24 eager calls of one plan on fresh
inputs (the 21st is the one to profile: ncu -s 20 -c 1), so that caches and
the workspace are warm and the profiled launch is a steady-state one.

    ncu --clock-control none -k regex:decode_attention -s 20 -c 1 \\
        python tools/ncu_row.py ROW PLAN [KV]
    (PLAN: default | split (the split kernels' rules) | balanced; KV: bf16 (default) | fp8)
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository's packages import as under `python -m`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from flint_attention.testing import FP8, make_paged_inputs, plans  # noqa: E402
from tools.quick_ab import ROWS  # noqa: E402

row, which = sys.argv[1], sys.argv[2]
fp8 = len(sys.argv) > 3 and sys.argv[3] == "fp8"
kw = dict(kv_dtype=FP8) if fp8 else {}  # make_paged_inputs' default scales
lens, kvh, window, width = ROWS[row]
max_pages = max(-(-n // 16) for n in lens)
sets = [make_paged_inputs(len(lens), lens, kvh, window, "cuda", poison=False,
                          max_blocks=max(width or 0, max_pages + 2), **kw) for _ in range(3)]
s = sets[0]
if which == "default":
    plan = plans.default_plan(s.q, s.kv_cache, window)
elif which == "split":
    plan = plans.split_rules_plan(s.q, s.kv_cache, window)
else:
    plan = plans.balanced_plan(s.kv_cache)
print(row, plan.name, flush=True)
for i in range(24):
    x = sets[i % 3]
    plans.run_with_plan(plan, x.q, x.kv_cache, x.block_tables, x.seq_lens, x.sinks, window,
                        128**-0.5, x.out, x.k_scale, x.v_scale)
torch.cuda.synchronize()
