"""Error measures a GPU or CPU output is judged by against a reference."""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``rel_fro`` bounds ||out - ref||_F / ||ref||_F; every coordinate must
    satisfy |out - ref| <= atol + rtol * |ref|."""

    rel_fro: float
    atol: float
    rtol: float = 0.0


# The op's bf16 output vs the float64 reference, for unit-variance inputs. The
# error comes from rounding P to bf16 (measured up to ~2**-7 absolute with a
# few attended positions) and from rounding the output to bf16, which alone
# costs up to half an ulp, 2**-8 |out|: that reaches 2**-6 for |out| >= 4, rare
# but possible with unit-variance V, hence the rtol term.
#
# With an fp8 cache the reference is computed on the dequantized cache (stored x
# scale): the e4m3 rounding belongs to the input, and the kernel adds the same
# two roundings on top as with bf16 (its K/V fragments are the stored e4m3
# values exactly, the scales are applied in fp32), so the same bound holds for
# dequantized values of unit variance (testing.inputs makes them so).
BF16_VS_F64 = Tolerance(rel_fro=1e-2, atol=2**-6, rtol=2**-8)


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    rel_fro: float
    max_abs: float
    worst_index: tuple[int, ...] | None  # the coordinate furthest over its bound
    worst_out: float
    worst_ref: float
    worst_excess: float  # |out - ref| - (atol + rtol |ref|) there; > 0 fails
    nonfinite_mismatches: int  # coordinates where out and ref disagree on NaN/Inf
    first_nonfinite: tuple[int, ...] | None

    def ok(self, tol: Tolerance) -> bool:
        return self.nonfinite_mismatches == 0 and self.rel_fro < tol.rel_fro and self.worst_excess <= 0

    def describe(self, tol: Tolerance) -> str:
        lines = [
            f"rel Frobenius error {self.rel_fro:.3e} (bound {tol.rel_fro:.3e}), "
            f"max abs error {self.max_abs:.3e} (bound {tol.atol:.3e} + {tol.rtol:.3e} |ref|)"
        ]
        if self.worst_index is not None:
            lines.append(
                f"worst coordinate {list(self.worst_index)}: out {self.worst_out!r}, "
                f"ref {self.worst_ref!r}, {self.worst_excess:+.3e} over its bound"
            )
        if self.nonfinite_mismatches:
            lines.append(
                f"{self.nonfinite_mismatches} NaN/Inf mismatches, first at "
                f"{list(self.first_nonfinite)}"
            )
        return "\n".join(lines)


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def error_report(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> ErrorReport:
    """Compares ``out`` with ``ref`` (any dtypes and devices, same shape)."""
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    finite = torch.isfinite(out) & torch.isfinite(ref)
    # NaN/Inf must agree exactly (same kind, same sign); finite values are
    # compared below on the coordinates where both are finite.
    mismatch = ~finite & ~((out == ref) | (out.isnan() & ref.isnan()))
    nonfinite = int(mismatch.sum())
    first_nonfinite = _index(int(mismatch.flatten().nonzero()[0]), out.shape) if nonfinite else None

    diff = torch.where(finite, out - ref, 0.0)
    ref_f = torch.where(finite, ref, 0.0)
    ref_norm = float(ref_f.norm())
    diff_norm = float(diff.norm())
    rel_fro = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    excess = diff.abs() - (tol.atol + tol.rtol * ref_f.abs())
    worst = None
    worst_out = worst_ref = 0.0
    worst_excess = -math.inf
    if out.numel():
        flat = int(excess.flatten().argmax())
        worst = _index(flat, out.shape)
        worst_out, worst_ref = float(out.flatten()[flat]), float(ref.flatten()[flat])
        worst_excess = float(excess.flatten()[flat])
    return ErrorReport(
        rel_fro=rel_fro,
        max_abs=float(diff.abs().max()) if out.numel() else 0.0,
        worst_index=worst,
        worst_out=worst_out,
        worst_ref=worst_ref,
        worst_excess=worst_excess,
        nonfinite_mismatches=nonfinite,
        first_nonfinite=first_nonfinite,
    )


def bound_used(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> float:
    """Largest |out - ref| / (atol + rtol |ref|) over the finite coordinates:
    the fraction of the per-coordinate bound the worst coordinate uses."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    finite = torch.isfinite(out) & torch.isfinite(ref)
    diff = torch.where(finite, out - ref, 0.0).abs()
    bound = tol.atol + tol.rtol * torch.where(finite, ref, 0.0).abs()
    return float((diff / bound).max()) if out.numel() else 0.0


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, what: str = "") -> None:
    """Fails with the worst coordinate and any NaN/Inf mismatches."""
    report = error_report(out, ref, tol)
    assert report.ok(tol), f"{what}\n{report.describe(tol)}"
