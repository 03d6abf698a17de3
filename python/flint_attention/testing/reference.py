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

from flint_attention.ops import PAGE_TOKENS

DEFAULT_SCALE = 128**-0.5  # the default head_dim's softmax scale
FLT_MAX = torch.finfo(torch.float32).max
LOG2E = math.log2(math.e)


def _fp32_overflow(x: torch.Tensor, factor: float | torch.Tensor = 1.0) -> torch.Tensor:
    """x (float64), with +-inf where x * factor is beyond float32's range: the
    op computes these quantities in float32 (docs/semantics.md: Non-finite values)."""
    return torch.where((x * factor).abs() > FLT_MAX, x.sign() * math.inf, x)


def attended_span(seq_len: int, window: int | None, q_tokens: int = 1, token: int | None = None) -> range:
    """Positions query token ``token`` of a request with ``seq_len`` keys and
    ``q_tokens`` query tokens attends to: its own position seq_len - q_tokens
    + token and the window before it. ``token=None``: the union over the
    request's query tokens (what a call reads)."""
    if token is None:  # from the first token at a position >= 0 to the last token
        first = attended_span(seq_len, window, q_tokens, max(q_tokens - seq_len, 0))
        last = attended_span(seq_len, window, q_tokens, q_tokens - 1)
        return range(first.start, last.stop) if len(last) else range(0)
    end = seq_len - q_tokens + token + 1
    if end <= 0:
        return range(0)
    start = 0 if window is None else max(end - window, 0)
    return range(start, end)


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
    sinks: torch.Tensor | None,
    window: int | None,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """float64 output of the op (q's shape), on q's device; with
    ``return_lse`` also the float64 log-sum-exp (q's shape without head_dim).

    q is [B, H, D] or [B, Q, H, D]; query head h reads kv head h // (H / Hkv);
    query token i sits at position seq_lens[b] - Q + i. out[b, i, h] =
    sum_p exp(s_p) V[p] / (sum_p exp(s_p) + exp(sinks[h])) with s_p = scale *
    q[b, i, h] . K[p] over the positions p token i attends; no positions gives
    zeros (and an lse of the sink, -inf without one). lse = log(sum_p exp(s_p)
    + exp(sinks[h])). With an fp8 cache K = stored x k_scale and V = stored x
    v_scale (per tensor or per kv head). NaN and infinities: see the module's
    docstring.
    """
    multi = q.dim() == 4
    q4 = q if multi else q.unsqueeze(1)
    batch, q_tokens, num_heads, head_dim = q4.shape
    num_kv_heads = kv_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros(q4.shape, dtype=torch.float64, device=q.device)
    sink_values = (
        torch.full((num_heads,), -math.inf, dtype=torch.float64) if sinks is None else sinks.to(torch.float64)
    )
    sinks_f32 = _fp32_overflow(sink_values.to(q.device).view(num_kv_heads, group, 1), LOG2E)
    lse = sinks_f32.reshape(1, 1, num_heads).repeat(batch, q_tokens, 1).clone()
    ks = _per_head(k_scale, num_kv_heads).to(q.device)
    vs = _per_head(v_scale, num_kv_heads).to(q.device)
    # One request and token at a time: the inputs are ragged and a padded
    # batch of long float64 K/V would not fit in memory.
    for b, seq_len in enumerate(seq_lens.tolist()):
        for i in range(q_tokens):
            span = attended_span(seq_len, window, q_tokens, i)
            if len(span) == 0:
                continue
            positions = torch.arange(span.start, span.stop, device=q.device)
            blocks = block_tables[b].long()[positions // PAGE_TOKENS].to(kv_cache.device)
            rows = kv_cache[blocks, :, (positions % PAGE_TOKENS).to(kv_cache.device)]
            rows = rows.to(q.device, torch.float64)  # [n, kvh, 2 D]
            stored_keys = rows[..., :head_dim].transpose(0, 1)  # [kvh, n, D]
            values = rows[..., head_dim:].transpose(0, 1) * vs
            queries = q4[b, i].to(torch.float64).view(num_kv_heads, group, head_dim)
            # q . K_stored, then scaled: float32 quantities in the op (overflow).
            dots = _fp32_overflow(queries @ stored_keys.transpose(1, 2))  # [kvh, G, n]
            logits = _fp32_overflow(scale * ks * dots, LOG2E)
            # Softmax over [logits, sink], shifted by the max of the finite ones
            # (0 if none is) so that infinities keep their limits.
            both = torch.cat([logits, sinks_f32], -1)
            shift = torch.where(both.isfinite(), both, -math.inf).amax(-1, keepdim=True)
            shift = torch.where(shift == -math.inf, 0.0, shift)
            weights = torch.exp(logits - shift)
            denominator = weights.sum(-1, keepdim=True) + torch.exp(sinks_f32 - shift)
            out[b, i] = ((weights @ values) / denominator).reshape(num_heads, head_dim)
            lse[b, i] = (shift + torch.log(denominator)).reshape(num_heads)
    if not multi:
        out, lse = out.squeeze(1), lse.squeeze(1)
    return (out, lse) if return_lse else out


def attended_kv_bytes(
    seq_lens: Sequence[int],
    window: int | None,
    num_kv_heads: int,
    elem_bytes: int = 2,
    head_dim: int = 128,
    q_tokens: int = 1,
) -> int:
    """Bytes of K and V a call must read: attended positions (the union over
    a request's query tokens) x kv heads x 2 x head_dim x the element size (2
    for bf16, 1 for fp8)."""
    positions = sum(len(attended_span(n, window, q_tokens)) for n in seq_lens)
    return positions * num_kv_heads * 2 * head_dim * elem_bytes
