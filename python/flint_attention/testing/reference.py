"""An independent float64 reference for ``flint_decode_attention``.

Written from the math, not from the kernel: gather the attended K/V through
the block table (dequantized, stored x scale, for an fp8 cache), softmax with
the sink as one more logit, all in float64. It shares nothing with the C++
paths but the input layout.

Non-finite values follow the rule of docs/semantics.md (Non-finite values): the
softmax is taken in the limit, with the max over the finite logits only, so
that exp(-inf) = 0 (a -inf logit has no weight, a -inf sink is no sink) and
exp(+inf) = inf (a +inf logit gives inf / inf = NaN, a +inf sink takes all the
weight); NaN propagates. On top of the math, explicitly: the op's logits are
float32, so q . K_stored, its scaled value s * scale * log2(e) * k_scale and
sink * log2(e) overflow to +-inf beyond FLT_MAX (_fp32_overflow).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from flint_attention.ops import GQA, HEAD_DIM, PAGE_TOKENS

DEFAULT_SCALE = HEAD_DIM**-0.5
FLT_MAX = torch.finfo(torch.float32).max
LOG2E = math.log2(math.e)


def _fp32_overflow(x: torch.Tensor, factor: float | torch.Tensor = 1.0) -> torch.Tensor:
    """x (float64), with +-inf where x * factor is beyond float32's range: the
    op computes these quantities in float32 (docs/semantics.md: Non-finite values)."""
    return torch.where((x * factor).abs() > FLT_MAX, x.sign() * math.inf, x)


def attended_span(seq_len: int, window: int | None) -> range:
    """Positions a query with ``seq_len`` keys attends to."""
    start = 0 if window is None else max(seq_len - window, 0)
    return range(start, seq_len)


def _per_head(scale: torch.Tensor | None, num_kv_heads: int) -> torch.Tensor:
    """[kvh, 1, 1] float64 scale (1 without one), broadcast over rows and dims."""
    if scale is None:
        return torch.ones(num_kv_heads, 1, 1, dtype=torch.float64)
    return scale.to("cpu", torch.float64).expand(num_kv_heads).reshape(num_kv_heads, 1, 1)


def reference_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: torch.Tensor,
    window: int | None,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """float64 [B, H, 128] output of the op, on q's device.

    out[b, h] = sum_p exp(s_p) V[p] / (sum_p exp(s_p) + exp(sinks[h])) with
    s_p = scale * q[b, h] . K[p] over the attended positions p; no positions
    (seq_len 0) gives zeros. With an fp8 cache K = stored x k_scale and V =
    stored x v_scale (per tensor or per kv head). NaN and infinities: see the
    module's docstring.
    """
    batch, num_heads, _ = q.shape
    num_kv_heads = kv_cache.shape[1]
    out = torch.zeros(batch, num_heads, HEAD_DIM, dtype=torch.float64, device=q.device)
    sinks_f32 = _fp32_overflow(sinks.to(torch.float64).view(num_kv_heads, GQA, 1), LOG2E)
    ks = _per_head(k_scale, num_kv_heads).to(q.device)
    vs = _per_head(v_scale, num_kv_heads).to(q.device)
    # One request at a time: the inputs are ragged and a padded batch of long
    # float64 K/V would not fit in memory.
    for b, seq_len in enumerate(seq_lens.tolist()):
        span = attended_span(seq_len, window)
        if len(span) == 0:
            continue
        positions = torch.arange(span.start, span.stop, device=q.device)
        blocks = block_tables[b].long()[positions // PAGE_TOKENS].to(kv_cache.device)
        rows = kv_cache[blocks, :, (positions % PAGE_TOKENS).to(kv_cache.device)]
        rows = rows.to(q.device, torch.float64)  # [n, kvh, 256]
        stored_keys = rows[..., :HEAD_DIM].transpose(0, 1)  # [kvh, n, 128]
        values = rows[..., HEAD_DIM:].transpose(0, 1) * vs
        queries = q[b].to(torch.float64).view(num_kv_heads, GQA, HEAD_DIM)
        # q . K_stored, then scaled: float32 quantities in the op (overflow).
        dots = _fp32_overflow(queries @ stored_keys.transpose(1, 2))  # [kvh, 8, n]
        logits = _fp32_overflow(scale * ks * dots, LOG2E)
        # Softmax over [logits, sink], shifted by the max of the finite ones
        # (0 if none is) so that infinities keep their limits.
        both = torch.cat([logits, sinks_f32], -1)
        shift = torch.where(both.isfinite(), both, -math.inf).amax(-1, keepdim=True)
        shift = torch.where(shift == -math.inf, 0.0, shift)
        weights = torch.exp(logits - shift)
        denominator = weights.sum(-1, keepdim=True) + torch.exp(sinks_f32 - shift)
        out[b] = ((weights @ values) / denominator).reshape(num_heads, HEAD_DIM)
    return out


def attended_kv_bytes(
    seq_lens: Sequence[int], window: int | None, num_kv_heads: int, elem_bytes: int = 2
) -> int:
    """Bytes of K and V a call must read: attended positions x kv heads x 256 x
    the element size (2 for bf16, 1 for fp8)."""
    return sum(len(attended_span(n, window)) for n in seq_lens) * num_kv_heads * 2 * HEAD_DIM * elem_bytes
