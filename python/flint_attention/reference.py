"""An independent float64 reference for ``flint_decode_attention``, the error
measures it is judged by, and random paged inputs for tests, demo and benchmarks.

The reference is written from the math, not from the kernel: gather the
attended K/V through the block table, softmax with the sink as one more logit,
all in float64. It shares nothing with the C++ paths but the input layout.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Sequence
from typing import NamedTuple

import torch

from flint_attention.ops import GQA, HEAD_DIM, PAGE_TOKENS

DEFAULT_SCALE = HEAD_DIM**-0.5


def attended_span(seq_len: int, window: int | None) -> range:
    """Positions a query with ``seq_len`` keys attends to."""
    start = 0 if window is None else max(seq_len - window, 0)
    return range(start, seq_len)


def reference_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: torch.Tensor,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """float64 [B, H, 128] output of the op, on q's device.

    out[b, h] = sum_p exp(s_p) V[p] / (sum_p exp(s_p) + exp(sinks[h])) with
    s_p = scale * q[b, h] . K[p] over the attended positions p; no positions
    (seq_len 0) gives zeros.
    """
    batch, num_heads, _ = q.shape
    num_kv_heads = kv_cache.shape[1]
    out = torch.zeros(batch, num_heads, HEAD_DIM, dtype=torch.float64, device=q.device)
    sink_logits = sinks.to(torch.float64).view(num_kv_heads, GQA, 1)
    # One request at a time: the inputs are ragged and a padded batch of long
    # float64 K/V would not fit in memory.
    for b, seq_len in enumerate(seq_lens.tolist()):
        span = attended_span(seq_len, window)
        if len(span) == 0:
            continue
        positions = torch.arange(span.start, span.stop, device=q.device)
        blocks = block_tables[b].long()[positions // PAGE_TOKENS]
        rows = kv_cache[blocks, :, positions % PAGE_TOKENS].to(torch.float64)  # [n, kvh, 256]
        keys = rows[..., :HEAD_DIM].transpose(0, 1)  # [kvh, n, 128]
        values = rows[..., HEAD_DIM:].transpose(0, 1)
        queries = q[b].to(torch.float64).view(num_kv_heads, GQA, HEAD_DIM)
        logits = scale * queries @ keys.transpose(1, 2)  # [kvh, 8, n]
        # Softmax over [logits, sink], shifted by the max of both for range.
        shift = torch.maximum(logits.amax(-1, keepdim=True), sink_logits)
        weights = torch.exp(logits - shift)
        denominator = weights.sum(-1, keepdim=True) + torch.exp(sink_logits - shift)
        out[b] = ((weights @ values) / denominator).reshape(num_heads, HEAD_DIM)
    return out


# --------------------------------------------------------------------------
# Error measures


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


# --------------------------------------------------------------------------
# Random paged inputs


class PagedInputs(NamedTuple):
    q: torch.Tensor  # [B, 8 * kvh, 128] bf16
    kv_cache: torch.Tensor  # [num_blocks, kvh, 16, 256] bf16
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32
    sinks: torch.Tensor  # [8 * kvh] fp32
    out: torch.Tensor  # [B, 8 * kvh, 128] bf16, NaN-filled
    seed: int  # reproduces these inputs: make_paged_inputs(..., seed=seed)


def _poison_row(length: int, device: torch.device) -> torch.Tensor:
    """NaN, +Inf and -Inf in turn: [length] bf16, to broadcast over a cache row."""
    pattern = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.bfloat16)
    return pattern.repeat(length // 3 + 1)[:length].to(device)


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
) -> PagedInputs:
    """Random inputs for one call, built to catch reads of anything not attended.

    q, K and V are unit-variance bf16, sinks N(0, 1) * 2; fresh each call unless
    ``seed`` is given (the seed used is returned, so a failure can be replayed).

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
            last pages, positions before the window) hold NaN/+Inf/-Inf.
        num_blocks, max_blocks: fix the cache's block count and the table's
            column count (e.g. to refill captured CUDA-graph inputs in place);
            by default just enough, plus a little slack.
    """
    lens = [seq_lens] * batch if isinstance(seq_lens, int) else [int(x) for x in seq_lens]
    assert len(lens) == batch, f"{len(lens)} seq_lens for batch {batch}"
    assert all(x >= 0 for x in lens)
    seed = secrets.randbits(62) if seed is None else seed
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    num_heads = GQA * num_kv_heads

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
        span = attended_span(n, window)
        pos = torch.arange(span.start, span.stop)
        attended[table[b, pos // PAGE_TOKENS], pos % PAGE_TOKENS] = True

    shape = (num_blocks, num_kv_heads, PAGE_TOKENS, 2 * HEAD_DIM)
    if strided_cache:
        # Two spare blocks in front, one behind, a spare kv head: the view's
        # block stride and data pointer differ from a dense tensor's.
        buffer = torch.empty(num_blocks + 3, num_kv_heads + 1, *shape[2:], dtype=torch.bfloat16, device=device)
        buffer[...] = _poison_row(shape[-1], device)
        kv_cache = buffer[2 : 2 + num_blocks, 1:]
    else:
        kv_cache = torch.empty(shape, dtype=torch.bfloat16, device=device)
    kv_cache.copy_(torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16))
    if poison:
        # [block, row, kv head, 256] view: the mask picks (block, row) slots.
        kv_cache.permute(0, 2, 1, 3)[~attended.to(device)] = _poison_row(shape[-1], device)

    if strided_io:
        # q stored head-major ([H, B, 128] transposed), out inside wider rows.
        q = torch.randn(num_heads, batch, HEAD_DIM, generator=gen, device=device, dtype=torch.bfloat16).transpose(0, 1)
        out = torch.full((batch, num_heads, 2 * HEAD_DIM), math.nan, dtype=torch.bfloat16, device=device)
        out = out[..., 64 : 64 + HEAD_DIM]
    else:
        q = torch.randn(batch, num_heads, HEAD_DIM, generator=gen, device=device, dtype=torch.bfloat16)
        out = torch.full((batch, num_heads, HEAD_DIM), math.nan, dtype=torch.bfloat16, device=device)
    sinks = 2 * torch.randn(num_heads, generator=gen, device=device)
    return PagedInputs(
        q=q,
        kv_cache=kv_cache,
        block_tables=table.to(device=device, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        sinks=sinks,
        out=out,
        seed=seed,
    )


def attended_kv_bytes(seq_lens: Sequence[int], window: int | None, num_kv_heads: int) -> int:
    """Bytes of K and V a call must read: attended positions x kv heads x 512."""
    return sum(len(attended_span(n, window)) for n in seq_lens) * num_kv_heads * 2 * HEAD_DIM * 2
