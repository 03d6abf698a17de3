"""Random paged inputs for tests, the demo and benchmarks, built so that any
read of a slot no request attends fails loudly (NaN / Inf poison)."""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from typing import NamedTuple

import torch

from flint_attention.ops import GQA, HEAD_DIM, PAGE_TOKENS
from flint_attention.testing.reference import attended_span

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value; torch turns larger ones into NaN
# vLLM's calibration sets scale = amax / 448; unit-variance data has amax ~4.
DEFAULT_FP8_SCALE = 4.0 / FP8_MAX


class PagedInputs(NamedTuple):
    q: torch.Tensor  # [B, G * kvh, D] (or [B, Q, G * kvh, D]) bf16
    kv_cache: torch.Tensor  # [num_blocks, kvh, 16, 2 * D] bf16 or float8_e4m3fn
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32
    sinks: torch.Tensor | None  # [G * kvh] fp32, or None
    out: torch.Tensor  # like q, NaN-filled
    seed: int  # reproduces these inputs: make_paged_inputs(..., seed=seed)
    k_scale: torch.Tensor | None = None  # fp8 cache: [1] or [kvh] fp32
    v_scale: torch.Tensor | None = None
    lse: torch.Tensor | None = None  # q's shape without D, fp32, NaN-filled (with_lse)


def _poison_row(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[length] of `dtype`, to broadcast over a cache row: NaN, +Inf and -Inf in
    turn for bf16; the two e4m3 NaNs (0x7F, 0xFF; e4m3fn has no Inf) for fp8."""
    if dtype == FP8:
        pattern = torch.tensor([0x7F, 0xFF], dtype=torch.uint8).view(FP8)
    else:
        pattern = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)
    return pattern.repeat(length // len(pattern) + 1)[:length].to(device)


def _scale_tensor(scale: float | Sequence[float] | None, num_kv_heads: int, device) -> torch.Tensor:
    if scale is None:
        scale = DEFAULT_FP8_SCALE
    values = [float(scale)] if isinstance(scale, (int, float)) else [float(x) for x in scale]
    assert len(values) in (1, num_kv_heads), f"{len(values)} scales for {num_kv_heads} kv heads"
    return torch.tensor(values, dtype=torch.float32, device=device)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., kvh, 16, 128] -> e4m3 stored = x / scale (per tensor or per kv
    head along dim -3), saturated at +-448 as a calibrated quantizer does."""
    s = scale.view(-1, 1, 1)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def make_paged_inputs(
    batch: int,
    seq_lens: int | Sequence[int],
    num_kv_heads: int,
    window: int | None = None,
    device: str | torch.device = "cpu",
    *,
    shared_pages: bool = False,
    shuffle_blocks: bool = True,
    strided_cache: bool = False,
    strided_io: bool = False,
    poison: bool = True,
    num_blocks: int | None = None,
    max_blocks: int | None = None,
    seed: int | None = None,
    kv_dtype: torch.dtype = torch.bfloat16,
    k_scale: float | Sequence[float] | None = None,
    v_scale: float | Sequence[float] | None = None,
    group: int = GQA,
    head_dim: int = HEAD_DIM,
    q_tokens: int | None = None,
    with_sinks: bool = True,
    with_lse: bool = False,
) -> PagedInputs:
    """Random inputs for one call, built to catch reads of anything not attended.

    q, K and V are unit-variance (for fp8: their dequantized values), sinks
    N(0, 1) * 2; fresh each call unless ``seed`` is given (the seed used is
    returned, so a failure can be replayed).

    Args:
        seq_lens: one length for all requests, or one per request.
        window: the window the call will use; positions before it count as
            unattended (poisoned).
        shared_pages: requests share a common prefix of pages (each request's
            first pages come from one pool of ``max_pages // 2`` pages).
        shuffle_blocks: block ids out of order (a random permutation).
        strided_cache: kv_cache is a view into a larger buffer (extra blocks
            and a spare kv head), pages still contiguous and 16-byte aligned.
        strided_io: q and out are views with unusual strides (q head-major,
            out a slice of wider rows).
        poison: cache slots no request attends (unused blocks, the tail of
            last pages, positions before the window) hold NaN/+Inf/-Inf (fp8:
            the e4m3 NaNs 0x7F / 0xFF).
        num_blocks, max_blocks: fix the cache's block count and the table's
            column count (e.g. to refill captured CUDA-graph inputs in place);
            by default just enough, plus a little slack.
        kv_dtype: torch.bfloat16 or torch.float8_e4m3fn.
        k_scale, v_scale: fp8 only: one scale (per tensor) or one per kv head;
            the cache stores x / scale of unit-variance x (saturated at +-448).
            Default: 4 / 448 per tensor, what calibrating unit data gives.
        group, head_dim: query heads per kv head (1-16) and the head dim (64,
            128 or 256).
        q_tokens: None for q of [B, H, D] (one query token); an int Q for
            [B, Q, H, D], the last Q positions of each request.
        with_sinks: sinks N(0, 1) * 2, or None.
        with_lse: also an lse output, NaN-filled.
    """
    lens = [seq_lens] * batch if isinstance(seq_lens, int) else [int(x) for x in seq_lens]
    assert len(lens) == batch, f"{len(lens)} seq_lens for batch {batch}"
    assert all(x >= 0 for x in lens)
    fp8 = kv_dtype == FP8
    assert fp8 or kv_dtype == torch.bfloat16, f"kv_dtype {kv_dtype}"
    assert fp8 or (k_scale is None and v_scale is None), "scales go with an fp8 cache"
    seed = secrets.randbits(62) if seed is None else seed
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    num_heads = group * num_kv_heads
    tokens = 1 if q_tokens is None else q_tokens

    # Block tables, built on the host: each request's pages in order, drawn
    # from a shared prefix pool and then from private pages.
    pages = [-(-n // PAGE_TOKENS) for n in lens]
    max_pages = max(pages, default=0)
    pool = max(max_pages // 2, 1) if shared_pages else 0
    needed = pool + sum(max(n - pool, 0) for n in pages)
    num_blocks = needed + 3 if num_blocks is None else num_blocks
    max_blocks = max_pages + 2 if max_blocks is None else max_blocks
    assert num_blocks >= needed, f"num_blocks {num_blocks} < {needed} pages needed"
    assert max_blocks >= max_pages, f"max_blocks {max_blocks} < {max_pages} pages needed"
    ids = torch.randperm(num_blocks, generator=cpu_gen) if shuffle_blocks else torch.arange(num_blocks)
    # Unused table entries hold valid ids that are never read (poisoned blocks).
    table = ids[torch.randint(num_blocks, (batch, max_blocks), generator=cpu_gen)]
    next_private = pool
    for b, n in enumerate(pages):
        shared = min(n, pool)
        table[b, :shared] = ids[:shared]
        table[b, shared:n] = ids[next_private : next_private + n - shared]
        next_private += n - shared

    # Which (block, row) slots some request attends; the rest get poisoned.
    attended = torch.zeros(num_blocks, PAGE_TOKENS, dtype=torch.bool)
    for b, n in enumerate(lens):
        span = attended_span(n, window, tokens)
        pos = torch.arange(span.start, span.stop)
        attended[table[b, pos // PAGE_TOKENS], pos % PAGE_TOKENS] = True

    shape = (num_blocks, num_kv_heads, PAGE_TOKENS, 2 * head_dim)
    poison_row = _poison_row(shape[-1], kv_dtype, device)
    if strided_cache:
        # Two spare blocks in front, one behind, a spare kv head: the view's
        # block stride and data pointer differ from a dense tensor's.
        buffer = torch.empty(num_blocks + 3, num_kv_heads + 1, *shape[2:], dtype=kv_dtype, device=device)
        buffer[...] = poison_row
        kv_cache = buffer[2 : 2 + num_blocks, 1:]
    else:
        kv_cache = torch.empty(shape, dtype=kv_dtype, device=device)
    values = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    scales = (None, None)
    if fp8:
        scales = (_scale_tensor(k_scale, num_kv_heads, device), _scale_tensor(v_scale, num_kv_heads, device))
        kv_cache[..., :head_dim] = quantize_fp8(values[..., :head_dim], scales[0])
        kv_cache[..., head_dim:] = quantize_fp8(values[..., head_dim:], scales[1])
    else:
        kv_cache.copy_(values)
    if poison:
        # [block, row, kv head, 256] view: the mask picks (block, row) slots.
        kv_cache.permute(0, 2, 1, 3)[~attended.to(device)] = poison_row

    rows = (batch, num_heads) if q_tokens is None else (batch, q_tokens, num_heads)
    if strided_io:
        # q stored head-major ([H, ..., D] with the heads first), out inside wider rows.
        q = torch.randn(num_heads, *rows[:-1], head_dim, generator=gen, device=device, dtype=torch.bfloat16)
        q = q.movedim(0, -2)
        out = torch.full((*rows, 2 * head_dim), math.nan, dtype=torch.bfloat16, device=device)
        out = out[..., 32 : 32 + head_dim]
    else:
        q = torch.randn(*rows, head_dim, generator=gen, device=device, dtype=torch.bfloat16)
        out = torch.full((*rows, head_dim), math.nan, dtype=torch.bfloat16, device=device)
    sinks = 2 * torch.randn(num_heads, generator=gen, device=device)
    if not with_sinks:
        sinks = None
    lse = torch.full(rows, math.nan, dtype=torch.float32, device=device) if with_lse else None
    return PagedInputs(
        q=q,
        kv_cache=kv_cache,
        block_tables=table.to(device=device, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        sinks=sinks,
        out=out,
        seed=seed,
        k_scale=scales[0],
        v_scale=scales[1],
        lse=lse,
    )
