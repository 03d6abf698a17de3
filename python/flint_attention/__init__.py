"""Flint: paged decode attention for Hopper GPUs (GQA 8, head_dim 128, bf16 and
fp8 caches).

``flint_decode_attention`` is the entry point; ``torch.ops.flint.decode_attention``
is the same op for callers that go through the dispatcher.
"""

from flint_attention.ops import flint_decode_attention

__all__ = ["flint_decode_attention"]
__version__ = "0.1.0"
