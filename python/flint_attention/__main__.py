"""``python -m flint_attention``: one realistic decode step, checked and timed.

Builds a random paged batch (8 requests, ragged lengths up to 4096, 8 kv heads,
sinks), runs it with full attention and with a 128-token window on the best
device here (the CUDA kernel on a Hopper GPU, otherwise the CPU path), checks
each output against the float64 reference, and prints the error next to the
tolerance it is held to, the time per call (median; CUDA events after a warm-up
on the GPU, perf_counter on the CPU) and the achieved K/V bandwidth (attended K
and V bytes / time). Exits with 1 if a check fails.

``--seed N`` fixes the inputs, the same on every device (they are drawn on the
CPU), so two runs, also one on the GPU and one on the CPU, get the same
inputs and their errors compare.
"""

from __future__ import annotations

import argparse
import math
import secrets
import statistics
import sys
import time

import torch

from flint_attention import flint_decode_attention
from flint_attention.ops import HAS_CUDA_KERNEL
from flint_attention.testing import (
    BF16_VS_F64,
    DEFAULT_SCALE,
    PagedInputs,
    attended_kv_bytes,
    bound_used,
    error_report,
    make_paged_inputs,
    reference_decode_attention,
)

BATCH = 8
MAX_LEN = 4096
NUM_KV_HEADS = 8
WINDOWS = [None, 128]


def pick_device() -> tuple[str, str]:
    """("cuda" or "cpu", why)."""
    if not HAS_CUDA_KERNEL:
        return "cpu", "the CPU path: this build of flint has no CUDA kernel (built without nvcc or with FLINT_CPU_ONLY=1)"
    if not torch.cuda.is_available():
        return "cpu", "the CPU path: no CUDA GPU is visible"
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return "cpu", f"the CPU path: {name} is sm_{major}{minor}, the kernel needs Hopper (sm_90)"
    return "cuda", f"the CUDA kernel on {name} (sm_90)"


def demo_lens(seed: int) -> list[int]:
    lens = torch.randint(1, MAX_LEN + 1, (BATCH,), generator=torch.Generator().manual_seed(seed)).tolist()
    lens[0] = MAX_LEN  # one request at the full length
    return lens


def demo_inputs(seed: int, window: int | None, device: str) -> PagedInputs:
    """The inputs for ``seed``: drawn on the CPU, then moved, so that a seed
    gives the same inputs on every device."""
    inp = make_paged_inputs(BATCH, demo_lens(seed), NUM_KV_HEADS, window, "cpu", seed=seed)
    return PagedInputs(*(t.to(device) if isinstance(t, torch.Tensor) else t for t in inp))


def _number(x: float) -> str:
    """2**k for a power of two, else 3 digits."""
    k = math.log2(x)
    return f"2**{int(k)}" if k == int(k) else f"{x:.2g}"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def median_seconds(call, device: str, reps: int) -> float:
    if device == "cuda":
        for _ in range(10):  # warm-up: first-call set-up, clocks, caches
            call()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events) / 1e3
    call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flint_attention", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="input seed; fixes the inputs on every device (default: fresh)")
    parser.add_argument("--reps", type=positive_int, default=None, help="timed calls, >= 1 (default: 100 GPU, 10 CPU)")
    args = parser.parse_args(argv)

    device, why = pick_device()
    reps = args.reps if args.reps is not None else (100 if device == "cuda" else 10)
    seed = secrets.randbits(62) if args.seed is None else args.seed
    tol = BF16_VS_F64
    lens = demo_lens(seed)
    print(
        f"flint decode attention: {BATCH} requests, seq_lens {lens}, {NUM_KV_HEADS} kv heads "
        f"({8 * NUM_KV_HEADS} query heads), head_dim 128, bf16, sinks, scale 128**-0.5, seed {seed}"
    )
    print(f"device: {device}, {why}")
    print(
        f"ok means, against the float64 reference: rel Frobenius err < {_number(tol.rel_fro)} and "
        f"|out - ref| <= {_number(tol.atol)} + {_number(tol.rtol)} |ref| at every coordinate "
        "(flint_attention.testing.BF16_VS_F64)"
    )
    ok = True
    for window in WINDOWS:
        inp = demo_inputs(seed, window, device)
        call_args = (inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, window, DEFAULT_SCALE)
        out = flint_decode_attention(*call_args, inp.out)
        ref = reference_decode_attention(*call_args)
        report = error_report(out, ref, tol)
        seconds = median_seconds(lambda: flint_decode_attention(*call_args, inp.out), device, reps)
        gbps = attended_kv_bytes(lens, window, NUM_KV_HEADS) / seconds / 1e9
        verdict = "ok" if report.ok(tol) else "FAILED"
        print(
            f"window {str(window):>4}: rel Frobenius err {report.rel_fro:.2e} ({report.rel_fro / tol.rel_fro:.2f} of "
            f"its bound), max abs err {report.max_abs:.2e}, worst coordinate at {bound_used(out, ref, tol):.2f} "
            f"of its bound -> {verdict}; {seconds * 1e6:.1f} us/call, {gbps:.1f} GB/s K/V"
        )
        if not report.ok(tol):
            print(report.describe(tol))
            ok = False
    print(f"{'all checks passed' if ok else 'CHECK FAILED'} (replay: python -m flint_attention --seed {seed})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
