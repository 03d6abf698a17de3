"""What the tests, the demo and the benchmarks share to judge the op: an
independent float64 reference, the error measures and tolerances, and random
paged inputs that poison every slot no request attends."""

from flint_attention.testing.compare import (
    BF16_VS_F64,
    ErrorReport,
    Tolerance,
    assert_close,
    bound_used,
    error_report,
)
from flint_attention.testing.inputs import FP8, PagedInputs, make_paged_inputs, quantize_fp8
from flint_attention.testing.reference import (
    DEFAULT_SCALE,
    attended_kv_bytes,
    attended_span,
    reference_decode_attention,
)

__all__ = [
    "BF16_VS_F64",
    "DEFAULT_SCALE",
    "FP8",
    "ErrorReport",
    "PagedInputs",
    "Tolerance",
    "assert_close",
    "attended_kv_bytes",
    "attended_span",
    "bound_used",
    "error_report",
    "make_paged_inputs",
    "quantize_fp8",
    "reference_decode_attention",
]
