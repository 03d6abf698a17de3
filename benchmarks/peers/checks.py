"""How the benchmark checks outputs against the float64 reference: the fp8
scales of its inputs and the bounds a peer's output is held to.

Flint is held to the package's documented bound (bf16 and fp8 alike). Peers
round differently (XQA's fp8 kernel feeds Q and P to fp8 tensor cores, vLLM
rounds dequantized K/V to bf16), so they get looser bounds that still fail a
dropped sink, a wrong window or a mixed-up fp8 scale (rel. error ~0.5 or more;
tests/test_bench_rows.py checks that on the benchmark's inputs).
"""

from __future__ import annotations

from flint_attention.testing import BF16_VS_F64, Tolerance

# Per-tensor fp8 scales (dequantized = stored x scale): 4 / 448 is what
# calibrating unit-variance data gives; V's differs so that a peer that mixes
# the two up fails its check.
K_SCALE = 4.0 / 448
V_SCALE = 8.0 / 448

FLINT_TOL = BF16_VS_F64
PEER_TOL = {"bf16": Tolerance(rel_fro=3e-2, atol=2**-5, rtol=2**-6),
            "fp8": Tolerance(rel_fro=0.15, atol=2**-3, rtol=2**-4)}
