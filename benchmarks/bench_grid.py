"""The benchmark's rows and everything about them that needs no GPU: shapes,
lengths, attended KV bytes, floors and goals, how many input sets keep L2
cold and how many calls a graph holds.

Two kinds of rows:

- 15 uniform rows (the group "legacy", the benchmark's first rows, names,
  shapes and placement kept): every request has seq_len tokens, block tables
  ceil(seq_len / 16) wide, each input set its own compact cache of just the
  attended pages, in shuffled order;
- serving-shaped rows (names ``srv_*`` and ``swa128_srv_*``): ragged
  lengths from fixed-seed distributions, batches padded with seq_len-0 rows to
  CUDA-graph capture sizes, block tables 8192 wide, every request's blocks drawn
  at random from one shared pool of tens of GB.

Every row has an fp8 twin (``<name>_fp8``): the same lengths, block
tables and queries on an e4m3 cache holding the same values quantized.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass

from benchmarks.bench_report import GOAL, GOAL_TBPS, STRETCH, goal_us
from flint_attention.testing import serving as S

PAGE_TOKENS = 16
HEAD_DIM = 128
GQA = 8
SCALE = HEAD_DIM**-0.5
ELEM_BYTES = {"bf16": 2, "fp8": 1}
KV_DTYPES = ("bf16", "fp8")

L2_BYTES_DEFAULT = 60 * 10**6  # H200
SMS_DEFAULT = 132  # H200

# Goals (bench_report), the same for bf16 and fp8: floor at GOAL_TBPS = 4.5 TB/s,
# time <= floor / 0.93 + 3 µs (GOAL), stretch floor / 0.95 + 2 µs (STRETCH).


@dataclass(frozen=True)
class Row:
    """One benchmark shape. ``seq_len`` is every request's length (uniform
    rows) or the longest (rows with ``lengths``)."""

    name: str
    batch: int
    kv_heads: int
    seq_len: int
    window: int | None = None  # attend to the last `window` positions
    lengths: tuple[int, ...] | None = None  # per request, padding rows 0; None: all seq_len
    table_width: int | None = None  # block-table columns; None: ceil(seq_len / 16)
    placement: str = "compact"  # "compact": each set its own cache; "pool": the shared pool
    kv_dtype: str = "bf16"
    spec: str = ""  # how the lengths were drawn
    group: str = "legacy"  # "legacy" or "serving"

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return self.lengths if self.lengths is not None else (self.seq_len,) * self.batch

    @property
    def num_heads(self) -> int:
        return GQA * self.kv_heads

    @property
    def width(self) -> int:
        return self.table_width or S.table_pages(self.seq_len)

    @property
    def elem_bytes(self) -> int:
        return ELEM_BYTES[self.kv_dtype]

    @property
    def page_bytes(self) -> int:
        """One (block, kv head) page: 16 tokens x 256 elements."""
        return PAGE_TOKENS * 2 * HEAD_DIM * self.elem_bytes

    @property
    def summary(self) -> S.LengthSummary:
        return S.LengthSummary.of(self.seq_lens, self.window)

    @property
    def attended(self) -> int:
        """Attended positions per kv head, summed over requests."""
        return self.summary.attended_tokens

    @property
    def kv_bytes(self) -> int:
        """Attended K+V bytes a call needs: positions x kv heads x 256 x element size."""
        return self.attended * self.kv_heads * 2 * HEAD_DIM * self.elem_bytes

    @property
    def qo_bytes(self) -> int:
        """q read + out written, bf16."""
        return 2 * self.batch * self.num_heads * HEAD_DIM * 2

    @property
    def pages_touched(self) -> int:
        """(request, kv head) pages overlapping attended positions, all requests."""
        return self.summary.attended_pages * self.kv_heads

    @property
    def attended_blocks(self) -> int:
        """Cache blocks holding attended positions (a block holds all kv heads)."""
        return self.summary.attended_pages

    @property
    def set_bytes(self) -> int:
        """Bytes one call touches in its input set: whole attended pages, q,
        out, the block-table entries it reads and seq_lens."""
        return (self.pages_touched * self.page_bytes + self.qo_bytes
                + 4 * (self.summary.attended_pages + self.batch))

    @property
    def block_bytes(self) -> int:
        return self.kv_heads * self.page_bytes

    def floor_us(self, tbps: float) -> float:
        return self.kv_bytes / (tbps * 1e12) * 1e6

    def goal_us(self, tbps: float = GOAL_TBPS) -> float:
        return goal_us(self.kv_bytes, GOAL, tbps)

    def stretch_us(self, tbps: float = GOAL_TBPS) -> float:
        return goal_us(self.kv_bytes, STRETCH, tbps)

    @property
    def twin(self) -> str:
        """The bf16 row's name (this row's own for bf16 rows)."""
        return self.name[: -len("_fp8")] if self.kv_dtype == "fp8" else self.name

    def as_dtype(self, kv_dtype: str) -> Row:
        """This row's twin of ``kv_dtype`` (the same lengths, tables and queries)."""
        if kv_dtype == self.kv_dtype:
            return self
        if kv_dtype == "bf16":
            return dataclasses.replace(self, name=self.twin, kv_dtype="bf16")
        assert kv_dtype == "fp8", kv_dtype
        return dataclasses.replace(self, name=self.name + "_fp8", kv_dtype="fp8")

    def describe(self) -> str:
        win = f" window {self.window}" if self.window else ""
        lens = f" lengths {self.spec}" if self.spec else f" L={self.seq_len}"
        return (f"B={self.batch} kvH={self.kv_heads}{lens}{win} table {self.width} wide, "
                f"{self.placement} placement, {self.kv_dtype}")


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def legacy_rows() -> list[Row]:
    """The 15 uniform rows (the group "legacy"): names, shapes and placement fixed."""
    rows = [Row(f"b1_l{_k(L)}", 1, 8, L) for L in (1024, 8192, 32768, 131072)]
    rows += [Row(f"b{B}_l8k", B, 8, 8192) for B in (4, 16, 64)]
    rows += [Row("b256_l2k", 256, 8, 2048), Row("b64_l32k", 64, 8, 32768)]
    rows += [Row("h1_b8_l8k", 8, 1, 8192), Row("h1_b128_l4k", 128, 1, 4096)]
    rows += [Row(f"swa128_b{B}_l8k", B, 8, 8192, 128) for B in (1, 16, 64, 256)]
    return rows


def serving_row(name: str, lens, spec: str, kv_heads: int = 8, window: int | None = None,
                pad: bool = True) -> Row:
    """A pool-placed row with 8192-wide tables, padded to a capture size."""
    lens = tuple(S.pad_to_capture_size(lens) if pad else lens)
    return Row(name, len(lens), kv_heads, max(lens), window, lens, S.TABLE_WIDTH, "pool",
               spec=spec, group="serving")


# Seeds are fixed per row: the lengths are the same in every run (tests pin a few).
def serving_rows() -> list[Row]:
    """Serving shapes: first the calls the performance goal was stated on
    (same shapes, so the numbers compare), then length distributions, kv heads
    1-2 at long contexts, and sliding-window layers at the same batch shapes."""
    lu = S.log_uniform
    goal_calls = [
        serving_row("srv_b32_logu32k", lu(32, 100, 32768, 2101), "log-uniform 100..32768"),
        serving_row("srv_s24_r20_1k8k", S.uniform(20, 1024, 8192, 2102),
                    "20 uniform 1024..8192 + 4 padding"),
        serving_row("srv_b8_logu16k", lu(8, 100, 16384, 2103), "log-uniform 100..16384"),
        serving_row("srv_b128_logu8k", lu(128, 50, 8192, 2104), "log-uniform 50..8192"),
        serving_row("srv_h1_b1_l64k", [65536], "1 x 65536 (a TP-8 shard)", kv_heads=1),
        serving_row("srv_b1_l1k", [1024], "1 x 1024 (a 128k-token model's table)"),
        serving_row("swa128_srv_s64_r50", lu(50, 128, 32768, 2107),
                    "50 log-uniform 128..32768 + 14 padding", window=128),
        serving_row("swa128_srv_b256_l8k", [8192] * 256, "256 x 8192", window=128),
    ]
    shapes = [  # (name, lengths, spec, kv heads)
        ("srv_s16_onelong128k", S.one_long_many_short(13, 131072, 200, 2048, 2111),
         "1 x 131072 among 12 log-uniform 200..2048, + 3 padding", 8),
        ("srv_s64_bimodal", S.bimodal(60, (100, 1024), (16384, 32768), 0.25, 2112),
         "60 bimodal: 75% log-uniform 100..1024, 25% 16384..32768, + 4 padding", 8),
        ("srv_s256_near2k", S.near_uniform(250, 2048, 0.1, 2113),
         "250 uniform 2048 +-10%, + 6 padding", 8),
        ("srv_s512_logu4k", lu(500, 16, 4096, 2114), "500 log-uniform 16..4096, + 12 padding", 8),
        ("srv_h1_s2_l128k", [131072, 131072], "2 x 131072", 1),
        ("srv_h1_s8_logu128k", lu(6, 32768, 131072, 2116),
         "6 log-uniform 32768..131072, + 2 padding", 1),
        ("srv_h2_s4_l128k", S.uniform(3, 98304, 131072, 2117),
         "3 uniform 98304..131072, + 1 padding", 2),
        ("srv_h2_s48_logu128k", lu(40, 32768, 131072, 2118),
         "40 log-uniform 32768..131072, + 8 padding", 2),
    ]
    own = [serving_row(n, lens, spec, kvh) for n, lens, spec, kvh in shapes]
    # Sliding-window layers at the same batch shapes (the lengths of the full rows).
    swa_of = ["srv_b32_logu32k", "srv_s24_r20_1k8k", "srv_b128_logu8k", "srv_s16_onelong128k",
              "srv_s64_bimodal", "srv_s512_logu4k", "srv_h1_s8_logu128k", "srv_h2_s48_logu128k"]
    by_name = {r.name: r for r in goal_calls + own}
    swa = [dataclasses.replace(by_name[n], name="swa128_" + n, window=128) for n in swa_of]
    return goal_calls + own + swa


def default_grid() -> list[Row]:
    """Every bf16 row, legacy first (the fp8 twins come from with_twins)."""
    return legacy_rows() + serving_rows()


def with_twins(rows: list[Row], kv_dtypes=KV_DTYPES) -> list[Row]:
    """Each bf16 row followed by its twins in ``kv_dtypes`` (in that order)."""
    out = []
    for r in rows:
        for d in kv_dtypes:
            out.append(r.as_dtype(d))
    return out


QUICK_ROWS = ("b1_l8k", "b64_l8k", "h1_b8_l8k", "swa128_b16_l8k", "srv_b32_logu32k",
              "srv_s24_r20_1k8k", "swa128_srv_s64_r50")
GROUPS = {"legacy": lambda r: r.group == "legacy", "serving": lambda r: r.group == "serving",
          "all": lambda r: True}


def parse_custom_row(spec: str) -> Row:
    """``B,kvH,L[,W]`` (W 0 or absent: full attention)."""
    parts = [int(x) for x in spec.split(",")]
    if len(parts) not in (3, 4) or min(parts[:3]) < 1 or (len(parts) == 4 and parts[3] < 0):
        raise ValueError(f"custom row must be B,kvH,L[,W] with positive B, kvH, L, got {spec!r}")
    batch, kv_heads, seq_len = parts[:3]
    if 8 % kv_heads:
        raise ValueError(f"custom row: kv heads must divide 8, got {kv_heads}")
    window = parts[3] if len(parts) == 4 and parts[3] > 0 else None
    name = f"b{batch}_h{kv_heads}_l{_k(seq_len)}" + (f"_w{window}" if window else "")
    return Row(name, batch, kv_heads, seq_len, window, group="custom")


def select_rows(names: str | None, quick: bool = False, kv_dtypes=KV_DTYPES) -> list[Row]:
    """Rows by comma-separated names, shell patterns (``srv_*``), groups
    (legacy, serving, all) or ``custom:B,kvH,L[,W]`` (';'-separated when
    several), the quick subset, or the whole grid; each with its twins in
    ``kv_dtypes``. A name ending in _fp8 selects that twin alone."""
    grid = default_grid()
    by_name = {r.name: r for r in grid}
    if not names:
        base = [by_name[n] for n in QUICK_ROWS] if quick else grid
        return with_twins(base, kv_dtypes)
    rows: list[Row] = []

    def add(r: Row) -> None:
        if r not in rows:
            rows.append(r)

    for item in _split_row_names(names):
        if item.startswith("custom:"):
            for r in with_twins([parse_custom_row(item[len("custom:"):])], kv_dtypes):
                add(r)
        elif item in GROUPS:
            for r in with_twins([r for r in grid if GROUPS[item](r)], kv_dtypes):
                add(r)
        elif item.endswith("_fp8") and item[:-4] in by_name:
            add(by_name[item[:-4]].as_dtype("fp8"))
        elif item in by_name:
            for r in with_twins([by_name[item]], kv_dtypes):
                add(r)
        elif any(c in item for c in "*?["):
            hits = [r for r in grid if fnmatch.fnmatchcase(r.name, item)]
            if not hits:
                raise ValueError(f"no row matches {item!r}")
            for r in with_twins(hits, kv_dtypes):
                add(r)
        else:
            raise ValueError(f"unknown row {item!r}; known rows: {', '.join(by_name)} "
                             f"(and groups {', '.join(GROUPS)})")
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


def check_requests(row: Row, peers: bool = False) -> list[int]:
    """Requests whose outputs are checked: the first and last, the longest and
    the shortest request, and (not for peers, which may leave padding rows
    untouched) the first padding row, whose output must be zeros."""
    lens = row.seq_lens
    real = [i for i, n in enumerate(lens) if n > 0]
    picks = set()
    if real:
        picks |= {real[0], real[-1], max(real, key=lambda i: lens[i]), min(real, key=lambda i: lens[i])}
    pads = [i for i, n in enumerate(lens) if n == 0]
    if pads and not peers:
        picks.add(pads[0])
    return sorted(picks)
