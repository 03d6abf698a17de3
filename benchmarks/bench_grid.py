"""The benchmark grid and everything about it that needs no GPU: row shapes,
attended KV bytes, the floor at a given bandwidth, how many input sets keep L2
cold, the op's default launch config (the spec's ``_launch_config``) and the
candidate configs of a tuning sweep."""

from __future__ import annotations

import math
from dataclasses import dataclass

PAGE_TOKENS = 16
HEAD_DIM = 128
GQA = 8
ROW_BYTES = 2 * HEAD_DIM * 2  # K + V of one token of one kv head, bf16
PAGE_BYTES = PAGE_TOKENS * ROW_BYTES  # one (block, kv head) page: 8 KB
SCALE = HEAD_DIM**-0.5

L2_BYTES_DEFAULT = 60 * 10**6  # H200
SMS_DEFAULT = 132  # H200


@dataclass(frozen=True)
class Row:
    """One benchmark shape: every request has seq_len tokens (seq_lens all = L)."""

    name: str
    batch: int
    kv_heads: int
    seq_len: int
    window: int | None = None  # attend to the last `window` positions

    @property
    def num_heads(self) -> int:
        return GQA * self.kv_heads

    @property
    def attended(self) -> int:
        """Attended positions per (request, kv head)."""
        return min(self.seq_len, self.window) if self.window else self.seq_len

    @property
    def start_tok(self) -> int:
        return self.seq_len - self.attended

    @property
    def num_pages(self) -> int:
        """Block-table width: pages holding positions [0, L)."""
        return -(-self.seq_len // PAGE_TOKENS)

    @property
    def start_page(self) -> int:
        return self.start_tok // PAGE_TOKENS

    @property
    def pages_touched(self) -> int:
        """Pages per (request, kv head) overlapping the attended positions."""
        return self.num_pages - self.start_page

    @property
    def kv_bytes(self) -> int:
        """Attended K+V bytes actually needed: B * kv heads * positions * 512."""
        return self.batch * self.kv_heads * self.attended * ROW_BYTES

    @property
    def qo_bytes(self) -> int:
        """q read + out written, bf16."""
        return 2 * self.batch * self.num_heads * HEAD_DIM * 2

    @property
    def set_bytes(self) -> int:
        """Bytes one call touches in its input set: whole attended pages, q,
        out, the block table and seq_lens."""
        pages = self.batch * self.kv_heads * self.pages_touched * PAGE_BYTES
        return pages + self.qo_bytes + self.batch * (self.num_pages + 1) * 4

    @property
    def num_blocks(self) -> int:
        """Cache blocks allocated per set: only the pages that are attended
        (a block holds all kv heads of 16 positions)."""
        return self.batch * self.pages_touched

    @property
    def block_bytes(self) -> int:
        return self.kv_heads * PAGE_BYTES

    @property
    def dense_bytes(self) -> int:
        """The unpaged K and V copy SDPA reads (attended positions only)."""
        return self.kv_bytes

    def floor_us(self, ceiling_tbps: float) -> float:
        return self.kv_bytes / (ceiling_tbps * 1e12) * 1e6

    def describe(self) -> str:
        win = f" window {self.window}" if self.window else ""
        return f"B={self.batch} kvH={self.kv_heads} L={self.seq_len}{win}"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def default_grid() -> list[Row]:
    rows = [Row(f"b1_l{_k(L)}", 1, 8, L) for L in (1024, 8192, 32768, 131072)]
    rows += [Row(f"b{B}_l8k", B, 8, 8192) for B in (4, 16, 64)]
    rows += [Row("b256_l2k", 256, 8, 2048), Row("b64_l32k", 64, 8, 32768)]
    rows += [Row("h1_b8_l8k", 8, 1, 8192), Row("h1_b128_l4k", 128, 1, 4096)]
    rows += [Row(f"swa128_b{B}_l8k", B, 8, 8192, 128) for B in (1, 16, 64, 256)]
    return rows


QUICK_ROWS = ("b1_l8k", "b64_l8k", "h1_b8_l8k", "swa128_b16_l8k")


def parse_custom_row(spec: str) -> Row:
    """``B,kvH,L[,W]`` (W 0 or absent: full attention)."""
    parts = [int(x) for x in spec.split(",")]
    if len(parts) not in (3, 4) or min(parts[:3]) < 1 or (len(parts) == 4 and parts[3] < 0):
        raise ValueError(f"custom row must be B,kvH,L[,W] with positive B, kvH, L, got {spec!r}")
    batch, kv_heads, seq_len = parts[:3]
    window = parts[3] if len(parts) == 4 and parts[3] > 0 else None
    name = f"b{batch}_h{kv_heads}_l{_k(seq_len)}" + (f"_w{window}" if window else "")
    return Row(name, batch, kv_heads, seq_len, window)


def select_rows(names: str | None, quick: bool) -> list[Row]:
    """Rows by comma-separated names (or ``custom:B,kvH,L[,W]``, ';'-separated
    when several), the quick subset, or the whole grid."""
    grid = default_grid()
    by_name = {r.name: r for r in grid}
    if not names:
        return [by_name[n] for n in QUICK_ROWS] if quick else grid
    rows = []
    for item in _split_row_names(names):
        if item.startswith("custom:"):
            rows.append(parse_custom_row(item[len("custom:"):]))
        elif item in by_name:
            rows.append(by_name[item])
        else:
            raise ValueError(f"unknown row {item!r}; known rows: {', '.join(by_name)}")
    return rows


def _split_row_names(names: str) -> list[str]:
    # custom:B,kvH,L,W contains commas: split on ';' first, then on commas
    # outside custom specs.
    out = []
    for chunk in names.split(";"):
        chunk = chunk.strip()
        if not chunk:
            continue
        if chunk.startswith("custom:"):
            out.append(chunk)
        else:
            out += [c.strip() for c in chunk.split(",") if c.strip()]
    return out


def num_sets(row: Row, target_bytes: int) -> int:
    """Distinct input sets so that one rotation touches >= target_bytes (a set
    that alone exceeds the target needs no company: each call streams more
    than L2 holds)."""
    return max(1, math.ceil(target_bytes / row.set_bytes))


def num_calls(row: Row, sets: int, ceiling_tbps: float, target_us: float,
              min_calls: int, max_calls: int) -> int:
    """Calls captured in one graph: about target_us of work at the floor,
    at least min_calls and every set once, rounded up to whole rotations."""
    est = max(row.floor_us(ceiling_tbps), 2.0)
    n = math.ceil(target_us / est)
    n = min(max(n, min_calls, sets), max(max_calls, sets))
    return math.ceil(n / sets) * sets


# --- the op's launch configuration -------------------------------------------------


Config = tuple  # (splits, warps, stages, min_pages, cluster 0/1)


def launch_config(batch: int, num_kv_heads: int, sliding: bool, max_tokens: int,
                  num_sms: int) -> Config:
    """The launcher's default (csrc/decode_attention/launch_config.h):
    (splits, warps, stages, min_pages, cluster); max_tokens = 16 x the block
    tables' width. Keep the two in step."""
    num_bh = batch * num_kv_heads
    if sliding:
        if batch <= 2:
            return (4, 4, 2, 1, 1)
        if num_bh >= 3 * num_sms:
            return (0, 4, 3, 1, 0)
        if batch <= 16:
            return (1, 4, 2, 2, 0)
        return (1, 4, 3 if batch <= 64 else 2, 1, 0)
    if num_bh <= 8 and max_tokens <= 1024:
        return (8, 4, 2, 1, 1)
    if num_bh <= 8:
        return (max(1, num_sms // num_bh), 9, 2, 1 if batch <= 2 else 4, 0)
    if batch <= 2:
        return (max(1, 2 * num_sms // num_bh), 8, 2, 1, 0)
    if batch <= 4:
        return (max(1, num_sms // num_bh), 8, 2, 2, 0)
    return (max(1, 2 * num_sms // num_bh), 4, 3, 2, 0)


def row_launch_config(row: Row, num_sms: int) -> Config:
    """launch_config for a row's inputs (block tables num_pages wide)."""
    return launch_config(row.batch, row.kv_heads, row.window is not None, 16 * row.num_pages,
                         num_sms)


def parse_config(text: str) -> Config:
    parts = [int(x) for x in text.split(",")]
    if len(parts) != 5 or parts[0] < 0 or min(parts[1:4]) < 1 or parts[4] not in (0, 1):
        raise ValueError(
            "config must be splits,warps,stages,min_pages,cluster (splits 0: one warp per "
            f"(request, kv head); cluster 0 or 1), got {text!r}"
        )
    return tuple(parts)


def format_config(cfg: Config) -> str:
    return ",".join(str(int(x)) for x in cfg)


def parse_env(text: str) -> dict | None:
    """'FLINT_VAR=VALUE[+FLINT_VAR=VALUE...]' (diagnostic variables for one
    run) -> {VAR: VALUE}, or None when it is not of that form."""
    env = {}
    for item in text.split("+"):
        var, eq, value = item.partition("=")
        if not eq or not var.startswith("FLINT_"):
            return None
        env[var] = value
    return env


# The compiled kernel variants (csrc/decode_attention/launch.cu), as
# (warps, stages) of the split kernel and of the warp-per-head kernel, and
# (splits, warps, stages) of the cluster-merge kernel.
SPLIT_VARIANTS = [(4, 2), (4, 3), (4, 4), (8, 2), (8, 3), (9, 2), (10, 2)]
WARP_PER_HEAD_VARIANTS = [(4, 2), (4, 3), (4, 4), (8, 2), (8, 3)]
CLUSTER_VARIANTS = [(4, 4, 2), (4, 4, 3), (8, 4, 2), (8, 4, 3), (4, 8, 2), (4, 8, 3),
                    (8, 8, 2), (8, 8, 3), (16, 4, 3), (16, 8, 2)]


def sweep_candidates(row: Row, num_sms: int, limit: int) -> list[Config]:
    """Configs around the default: splits at 1/2, 3/4, 1, 3/2, 2 and 4 x its
    choice (plus 1, 2, 4, 8 for sliding rows) for every compiled (warps,
    stages) and min_pages {1, 2, 4}; every compiled cluster variant, and every
    warp-per-head one where there are at least as many (request, kv head) pairs
    as SMs. The warp-per-head and cluster ones first, then by how many fields
    differ from the default (then by how far splits moved), the default first,
    cut at ``limit``."""
    sliding = row.window is not None
    d = row_launch_config(row, num_sms)
    s0 = d[0] if d[0] > 0 else 1
    splits = {max(1, round(s0 * f)) for f in (0.5, 0.75, 1.0, 1.5, 2.0, 4.0)}
    if sliding:
        splits |= {1, 2, 4, 8}
    cands = set()
    for s in splits:
        for w, st in SPLIT_VARIANTS:
            for mp in (1, 2, 4):
                cands.add((s, w, st, mp, 0))
    for s, w, st in CLUSTER_VARIANTS:
        cands.add((s, w, st, 1, 1))  # every rank stays active: min_pages is unused
    if row.batch * row.kv_heads >= num_sms:  # fewer pairs than SMs: one warp each is hopeless
        for w, st in WARP_PER_HEAD_VARIANTS:
            cands.add((0, w, st, 1, 0))  # one warp per (request, kv head)
    cands.add(d)

    def key(c):
        if c == d:
            return (0, 0, 0.0, c)
        if c[0] == 0 or c[4] == 1:  # warp-per-head and cluster kernels: always tried
            return (1, 0, 0.0, c)
        diff = sum(a != b for a, b in zip(c, d))
        return (2, diff, abs(math.log2(c[0] / s0)), c)

    ordered = sorted(cands, key=key)
    return ordered[: max(1, limit)]
