"""Flint: paged decode attention for Hopper GPUs (1 to 16 query heads per kv
head, 1 to 8 query tokens per request, bf16 and fp8 caches).

``flint_decode_attention`` is the entry point; ``torch.ops.flint.decode_attention``
is the same op for callers that go through the dispatcher.
"""

from flint_attention.ops import flint_decode_attention

__all__ = ["flint_decode_attention"]
__version__ = "0.1.0"
