"""Serving-shaped inputs: how a serving engine's decode calls look.

A serving engine keeps one KV pool of tens of GB and hands each request
blocks from anywhere in it; its block tables are as wide as the longest
context the model allows (8192 blocks for 128k tokens); batch lengths are
ragged, and a batch captured in a CUDA graph is padded with seq_len-0 rows up
to the next capture size. This module builds such inputs, reproducibly:

- length distributions drawn from a fixed seed (``random.Random``, so the same
  lengths on every machine and Python version): ``log_uniform``,
  ``one_long_many_short``, ``bimodal``, ``near_uniform``;
- ``pad_to_capture_size``: seq_len-0 rows up to the next of CAPTURE_SIZES;
- ``draw_block_tables``: block tables for one batch in ``n_sets`` placements,
  each request's attended pages on distinct blocks drawn at random from a pool;
- ``KVPool``: one allocation of a pool, viewed as [num_blocks, kv_heads, 16, 256]
  for any kv head count, filled once (an fp8 pool as the quantized twin of a
  bf16 one, block for block);
- ``LengthSummary``: count, min / median / max, padding rows, attended pages.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Sequence

import torch

from flint_attention.ops import HEAD_DIM, PAGE_TOKENS
from flint_attention.testing.inputs import FP8, quantize_fp8
from flint_attention.testing.reference import attended_span

# vLLM's default CUDA-graph capture sizes up to 512: serving batches are padded to these.
CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512)
TABLE_WIDTH = 8192  # block-table columns of a 128k-token model at 16 tokens a page


# --- lengths ------------------------------------------------------------------------------


def _round_len(x: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, int(round(x))))


def log_uniform(n: int, lo: int, hi: int, seed: int) -> list[int]:
    """``n`` lengths with log(length) uniform in [log lo, log hi]."""
    rng = random.Random(seed)
    a, b = math.log(lo), math.log(hi)
    return [_round_len(math.exp(a + (b - a) * rng.random()), lo, hi) for _ in range(n)]


def uniform(n: int, lo: int, hi: int, seed: int) -> list[int]:
    """``n`` lengths uniform in [lo, hi]."""
    rng = random.Random(seed)
    return [_round_len(lo + (hi - lo) * rng.random(), lo, hi) for _ in range(n)]


def near_uniform(n: int, center: int, spread: float, seed: int) -> list[int]:
    """``n`` lengths uniform in center x [1 - spread, 1 + spread]."""
    lo, hi = int(center * (1 - spread)), int(center * (1 + spread))
    return uniform(n, lo, hi, seed)


def one_long_many_short(n: int, long_len: int, short_lo: int, short_hi: int, seed: int) -> list[int]:
    """One request of ``long_len`` at a random position among ``n - 1``
    log-uniform short ones."""
    rng = random.Random(seed)
    lens = log_uniform(n - 1, short_lo, short_hi, seed + 1)
    lens.insert(int(rng.random() * n), long_len)
    return lens


def bimodal(n: int, short: tuple[int, int], long: tuple[int, int], long_fraction: float,
            seed: int) -> list[int]:
    """Each of ``n`` lengths log-uniform in ``long`` with probability
    ``long_fraction``, else log-uniform in ``short``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lo, hi = long if rng.random() < long_fraction else short
        a, b = math.log(lo), math.log(hi)
        out.append(_round_len(math.exp(a + (b - a) * rng.random()), lo, hi))
    return out


def capture_size(n: int, sizes: Sequence[int] = CAPTURE_SIZES) -> int:
    """The smallest capture size >= n (n itself beyond the largest)."""
    return next((s for s in sizes if s >= n), n)


def pad_to_capture_size(lens: Sequence[int], sizes: Sequence[int] = CAPTURE_SIZES) -> list[int]:
    """``lens`` followed by seq_len-0 rows up to the next capture size (a
    CUDA-graph-padded batch puts them last)."""
    lens = list(lens)
    return lens + [0] * (capture_size(len(lens), sizes) - len(lens))


# --- pages --------------------------------------------------------------------------------


def page_span(seq_len: int, window: int | None) -> range:
    """Block-table columns whose pages hold attended positions."""
    span = attended_span(seq_len, window)
    if len(span) == 0:
        return range(0)
    return range(span.start // PAGE_TOKENS, (span.stop - 1) // PAGE_TOKENS + 1)


def table_pages(seq_len: int) -> int:
    """Block-table columns a request of ``seq_len`` tokens uses."""
    return -(-seq_len // PAGE_TOKENS)


@dataclasses.dataclass(frozen=True)
class LengthSummary:
    count: int  # rows, padding included
    padding: int  # seq_len-0 rows
    min: int  # over the requests (seq_len > 0); 0 if none
    median: float
    max: int
    attended_tokens: int  # per kv head, summed over requests
    attended_pages: int  # block-table entries read, per kv head

    @classmethod
    def of(cls, lens: Sequence[int], window: int | None = None) -> LengthSummary:
        real = [n for n in lens if n > 0]
        return cls(
            count=len(lens), padding=len(lens) - len(real),
            min=min(real, default=0), median=statistics.median(real) if real else 0.0,
            max=max(real, default=0),
            attended_tokens=sum(len(attended_span(n, window)) for n in lens),
            attended_pages=sum(len(page_span(n, window)) for n in lens),
        )

    def describe(self) -> str:
        n = self.count - self.padding
        pad = f" + {self.padding} padding" if self.padding else ""
        lens = (f" x {self.max}" if self.min == self.max else
                f" requests{pad}, lengths {self.min}/{self.median:g}/{self.max} (min/median/max)")
        if self.min == self.max:
            lens = f"{lens}{pad}"
        return f"{n}{lens}, {self.attended_pages} attended pages"


# --- block tables -------------------------------------------------------------------------


def draw_block_tables(lens: Sequence[int], window: int | None, num_blocks: int, width: int,
                      n_sets: int, seed: int) -> torch.Tensor:
    """[n_sets, B, width] int32 block tables (CPU) for one batch in ``n_sets``
    placements over a pool of ``num_blocks`` blocks.

    Each request's attended pages sit on distinct blocks drawn at random from the
    whole pool, distinct across the sets too where the pool holds them all (so
    consecutive calls rotating over the sets share no block), else distinct
    within each set. Every other entry (pages before a window, columns past a
    request's length) holds a random valid block id, which is never attended.
    """
    spans = [page_span(n, window) for n in lens]
    assert all(table_pages(n) <= width for n in lens), f"a length exceeds {width} pages"
    per_set = sum(len(s) for s in spans)
    assert per_set <= num_blocks, f"{per_set} attended pages do not fit a pool of {num_blocks} blocks"
    gen = torch.Generator().manual_seed(seed)
    tables = torch.randint(num_blocks, (n_sets, len(lens), width), generator=gen, dtype=torch.int32)
    joint = per_set * n_sets <= num_blocks
    ids = torch.randperm(num_blocks, generator=gen, dtype=torch.int32) if joint else None
    for s in range(n_sets):
        if not joint:
            ids = torch.randperm(num_blocks, generator=gen, dtype=torch.int32)
        off = s * per_set if joint else 0
        for b, span in enumerate(spans):
            tables[s, b, span.start:span.stop] = ids[off:off + len(span)]
            off += len(span)
    return tables


# --- the pool -----------------------------------------------------------------------------


class KVPool:
    """One allocation of ``nbytes`` holding a paged cache of ``dtype``, viewed
    as [num_blocks, kv_heads, 16, 256] for any kv head count dividing
    ``max_kv_heads`` (a block of 8 kv heads is 8 blocks of 1)."""

    def __init__(self, num_blocks: int, max_kv_heads: int, dtype: torch.dtype, device):
        assert dtype in (torch.bfloat16, FP8), dtype
        self.dtype, self.max_kv_heads, self.num_blocks = dtype, max_kv_heads, num_blocks
        self.storage = torch.empty(num_blocks, max_kv_heads, PAGE_TOKENS, 2 * HEAD_DIM, dtype=dtype,
                                   device=device)

    @classmethod
    def of_bytes(cls, nbytes: int, max_kv_heads: int, dtype: torch.dtype, device) -> KVPool:
        block = max_kv_heads * PAGE_TOKENS * 2 * HEAD_DIM * torch.finfo(dtype).bits // 8
        return cls(max(1, nbytes // block), max_kv_heads, dtype, device)

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def blocks(self, kv_heads: int) -> int:
        assert self.max_kv_heads % kv_heads == 0, f"{kv_heads} kv heads do not divide {self.max_kv_heads}"
        return self.num_blocks * (self.max_kv_heads // kv_heads)

    def view(self, kv_heads: int) -> torch.Tensor:
        return self.storage.view(self.blocks(kv_heads), kv_heads, PAGE_TOKENS, 2 * HEAD_DIM)

    def _chunks(self, chunk_blocks: int):
        for start in range(0, self.num_blocks, chunk_blocks):
            yield self.storage[start:start + chunk_blocks]

    def fill_random(self, seed: int, chunk_bytes: int = 1 << 30) -> None:
        """Unit-variance bf16 values (bf16 pools only), in chunks."""
        assert self.dtype == torch.bfloat16, "fill a bf16 pool, then quantize a twin from it"
        gen = torch.Generator(device=self.storage.device).manual_seed(seed)
        per_block = self.storage[0].numel() * 2
        for chunk in self._chunks(max(1, chunk_bytes // per_block)):
            chunk.copy_(torch.randn(chunk.shape, generator=gen, device=chunk.device, dtype=torch.bfloat16))

    def quantized_twin(self, k_scale: torch.Tensor, v_scale: torch.Tensor,
                       chunk_bytes: int = 1 << 30) -> KVPool:
        """An fp8 pool holding this bf16 pool's values, block for block, stored
        as x / scale (per-tensor scales, [1])."""
        assert self.dtype == torch.bfloat16 and k_scale.numel() == 1 and v_scale.numel() == 1
        twin = KVPool(self.num_blocks, self.max_kv_heads, FP8, self.storage.device)
        per_block = self.storage[0].numel() * 6  # the fp32 temporary dominates
        step = max(1, chunk_bytes // per_block)
        for start in range(0, self.num_blocks, step):
            src, dst = self.storage[start:start + step], twin.storage[start:start + step]
            dst[..., :HEAD_DIM] = quantize_fp8(src[..., :HEAD_DIM], k_scale.reshape(1))
            dst[..., HEAD_DIM:] = quantize_fp8(src[..., HEAD_DIM:], v_scale.reshape(1))
        return twin
