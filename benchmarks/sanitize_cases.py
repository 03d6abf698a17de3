"""A few small launches of every merge path, for compute-sanitizer
(memcheck, racecheck, synccheck): one split, the split merge through the
workspace, cluster merge, seq_len 0, window, PDL on, the page ring refilled
before and after the wait. Checks results loosely so a run that is silently
wrong still fails."""

import os

import torch

from flint_attention.testing import BF16_VS_F64, assert_close, make_paged_inputs, reference_decode_attention

CASES = [  # (config or None for the heuristic, seq_lens, kv heads, window)
    (None, [0, 17, 300, 33], 2, None),
    ("1,4,2,1,0", [5, 40, 0], 1, None),
    ("6,8,2,1,0", [1000, 3, 0], 1, None),
    ("33,9,2,1,0", [8192, 3, 0], 1, None),  # 9 warps: the 9th only streams
    ("13,10,2,2,0", [5000, 700], 2, 64),
    ("16,10,2,1,0", [8192, 20000, 3], 1, None),  # all 10 stream at 8192, 8 at 20000
    ("5,4,3,1,0", [700, 129], 2, 64),
    ("4,4,3,1,1", [0, 500, 17], 1, 128),
    ("8,4,2,1,1", [300, 1], 1, None),
    ("8,8,3,1,1", [0, 2000, 40], 1, None),
    ("16,8,2,1,1", [900, 3], 1, 300),  # 16 ranks, half the threads idle in the merge
    ("0,4,3,1,0", [0, 700, 17, 129, 5], 2, 128),  # one warp per (request, kv head)
    ("0,8,2,1,0", [3000, 1, 0, 260, 17, 40, 999, 5, 64], 1, 200),
    # More pairs (1104) than 132 SMs hold 8-warp CTAs' warps: the persistent
    # warps loop over pairs through one ring.
    ("0,8,2,1,0", [(37 * i) % 70 for i in range(138)], 8, 48),
    # The same with 4-slot rings: some pairs are shorter than the 3 leading
    # pages a chained stream issues for the next pair.
    ("0,4,4,1,0", [(37 * i) % 90 for i in range(138)], 8, 64),
]
# The same launches with the ring refilled the other way round where the
# launch's rule picks one (FLINT_REFILL_AFTER_WAIT; launch.cu).
FORCED_REFILL = [
    ("8,4,2,1,1", [300, 1], 1, None, "1"),
    ("0,4,3,1,0", [0, 700, 17, 129, 5], 2, 128, "1"),
    ("6,8,2,1,0", [1000, 3, 0], 1, None, "0"),
    ("6,8,2,1,0", [1000, 3, 0], 1, None, "2"),
    ("0,4,3,1,0", [0, 700, 17, 129, 5], 2, 128, "2"),
]


def set_env(name, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


for cfg, seq_lens, kvh, window, *refill in CASES + FORCED_REFILL:
    set_env("FLINT_LAUNCH_CONFIG", cfg)
    set_env("FLINT_REFILL_AFTER_WAIT", refill[0] if refill else None)
    inp = make_paged_inputs(len(seq_lens), seq_lens, kvh, window, "cuda")
    args = (inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, window, 0.088)
    torch.ops.flint.decode_attention(*args, inp.out)
    torch.cuda.synchronize()
    assert_close(inp.out, reference_decode_attention(*args), BF16_VS_F64)
    print(f"ok {cfg} {seq_lens} kvh={kvh} window={window} refill={refill}", flush=True)
print("sanitize cases done")
