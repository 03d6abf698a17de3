"""Shared test helpers: devices, tolerances, running the op, comparing outputs.

Every op test takes the ``device`` fixture and runs on "cpu" and "cuda"; the
"cuda" variant skips unless a Hopper (sm_90) GPU is present.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import pytest
import torch

# The repository root, so that the benchmark and the tools import as packages
# (benchmarks.bench_grid, tools.sass_diff) in the tests of their logic.
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from flint_attention import flint_decode_attention
from flint_attention.ops import HAS_CUDA_KERNEL
from flint_attention.testing import (
    BF16_VS_F64,
    DEFAULT_SCALE,
    PagedInputs,
    Tolerance,
    assert_close,
    bound_used,
    error_report,
    make_paged_inputs,
    reference_decode_attention,
)

# GPU output vs the CPU path on the same inputs. Both follow the same numerics
# and differ only in summation order and in where P is rounded to bf16 (the
# GPU rounds against running maxima): 1-ulp flips of the bf16 output (an ulp
# is <= 2**-7 |out|) plus noise under 2**-7. Measured on the H200 (31836c9,
# 419 comparisons logged with FLINT_ERROR_LOG, tools/error_summary.py): worst
# rel Frobenius 3.26e-3, worst coordinate 0.64 of this bound; 2.5x
# (Frobenius) and 2x (per coordinate) tighter than the bound against float64. The two paths' errors against
# float64 (2.3e-3 and 2.4e-3) are largely independent, so a tighter Frobenius
# bound would sit on the noise.
GPU_VS_CPU = Tolerance(rel_fro=4e-3, atol=2**-7, rtol=2**-7)


def _hopper_skip_reason() -> str | None:
    if not HAS_CUDA_KERNEL:
        return "this build of flint has no CUDA kernel (built without nvcc or with FLINT_CPU_ONLY=1)"
    if not torch.cuda.is_available():
        return "needs a Hopper (sm_90) GPU; none here"
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        name = torch.cuda.get_device_name()
        return f"needs a Hopper (sm_90) GPU; found {name} (sm_{cap[0]}{cap[1]})"
    return None


HOPPER_SKIP_REASON = _hopper_skip_reason()

# flint_attention._testing (the test-only ops: explicit launch plans, the plan
# rules on the host) is built with the CUDA kernel only. In a build with the
# kernel a failing import is an error, not a skip.
TESTING_SKIP_REASON = None if HAS_CUDA_KERNEL else (
    "needs flint_attention._testing, which only a build with the CUDA kernel has (this one was "
    "built without nvcc or with FLINT_CPU_ONLY=1)"
)
needs_hopper = pytest.mark.skipif(HOPPER_SKIP_REASON is not None, reason=str(HOPPER_SKIP_REASON))

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=needs_hopper)]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def run_op(inp: PagedInputs, window: int | None, scale: float = DEFAULT_SCALE) -> torch.Tensor:
    """Calls the op on ``inp`` (writing inp.out) and returns out."""
    return flint_decode_attention(
        inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, window, scale, inp.out,
        k_scale=inp.k_scale, v_scale=inp.v_scale, lse=inp.lse,
    )


def reference(inp: PagedInputs, window: int | None, scale: float = DEFAULT_SCALE, **kwargs):
    return reference_decode_attention(
        inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, window, scale,
        inp.k_scale, inp.v_scale, **kwargs,
    )


def _cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.cpu()


def cpu_path(inp: PagedInputs, window: int | None, scale: float = DEFAULT_SCALE) -> torch.Tensor:
    """The CPU path's output on CPU copies of ``inp`` (the yardstick for the GPU)."""
    out = torch.empty(inp.out.shape, dtype=inp.out.dtype)
    torch.ops.flint.decode_attention(
        inp.q.cpu(),
        inp.kv_cache.cpu(),
        inp.block_tables.cpu(),
        inp.seq_lens.cpu(),
        _cpu(inp.sinks),
        window,
        scale,
        out,
        _cpu(inp.k_scale),
        _cpu(inp.v_scale),
    )
    return out


def _log_error(kind: str, out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> None:
    """With FLINT_ERROR_LOG=path, appends one JSON line per comparison, so a
    GPU run measures the errors the tolerances are set from."""
    path = os.environ.get("FLINT_ERROR_LOG")
    if not path:
        return
    report = error_report(out, ref, tol)
    line = dict(kind=kind, test=os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                rel_fro=report.rel_fro, max_abs=report.max_abs, bound_used=bound_used(out, ref, tol))
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _summary(seq_lens: torch.Tensor) -> str:
    lens = seq_lens.tolist()
    return str(lens) if len(lens) <= 20 else f"{lens[:20]}... ({len(lens)} requests)"


def check_output(
    out: torch.Tensor, inp: PagedInputs, window: int | None, scale: float = DEFAULT_SCALE, what: str = ""
) -> None:
    """Checks an output computed from ``inp`` against the float64 reference
    and, for a GPU output, against the CPU path with the tighter bound."""
    what = f"{what} seed={inp.seed} window={window} scale={scale} seq_lens={_summary(inp.seq_lens)}"
    ref = reference(inp, window, scale)
    _log_error(f"{out.device.type} vs float64", out, ref, BF16_VS_F64)
    assert_close(out, ref, BF16_VS_F64, f"vs float64 reference: {what}")
    if out.is_cuda:
        cpu = cpu_path(inp, window, scale)
        _log_error("cuda vs cpu path", out, cpu, GPU_VS_CPU)
        assert_close(out, cpu, GPU_VS_CPU, f"GPU vs CPU path: {what}")


def check_against_reference(
    inp: PagedInputs, window: int | None, scale: float = DEFAULT_SCALE, what: str = ""
) -> torch.Tensor:
    """Runs the op on ``inp`` and checks its output (check_output). Returns out."""
    out = run_op(inp, window, scale)
    check_output(out, inp, window, scale, what)
    return out


# Cache / IO layouts for the grids, each a set of make_paged_inputs flags.
LAYOUTS = {
    "in_order": dict(shuffle_blocks=False),
    "shuffled_shared": dict(shared_pages=True),
    "strided": dict(strided_cache=True, strided_io=True),
    "shared_strided": dict(shared_pages=True, strided_cache=True),
}


# Tensor-tuple form for the kernel tests that call torch.ops directly.
def cuda_inputs(seq_lens, num_kv_heads: int, window: int | None):
    """Random paged inputs on the GPU as (q, kv_cache, block_tables, seq_lens,
    sinks, out): NaN/Inf in every unattended cache slot, shuffled block ids,
    out prefilled with NaN (flint_attention.testing.make_paged_inputs)."""
    inp = make_paged_inputs(len(seq_lens), seq_lens, num_kv_heads, window, "cuda")
    return inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, inp.out


def check_vs_f64(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Against the float64 reference with the documented bf16 bound (BF16_VS_F64)."""
    assert_close(out, ref, BF16_VS_F64)


def layout_grid(batches, kv_heads, windows):
    """pytest params (batch, num_kv_heads, window, layout) for every batch, kv
    head count and window; the layout rotates so that each one meets every
    batch size, kv head count and window."""
    for (ib, batch), (ik, kvh), (iw, window) in itertools.product(
        enumerate(batches), enumerate(kv_heads), enumerate(windows)
    ):
        layout = list(LAYOUTS)[(ib + ik + iw) % len(LAYOUTS)]
        yield pytest.param(batch, kvh, window, layout, id=f"b{batch}-kvh{kvh}-w{window}-{layout}")
