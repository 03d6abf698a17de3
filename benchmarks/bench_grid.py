"""The benchmark's rows and everything about them that needs no GPU: shapes,
lengths, attended KV bytes, floors and goals, how many input sets keep L2
cold and how many calls a graph holds.

Rows carry a shape: query heads per kv head (``gqa``, G), ``head_dim`` (D)
and whether the call has sinks. The first two groups are the benchmark's
original rows (G 8, D 128, sinks; the group "core"):

- 15 uniform rows (the group "legacy", the benchmark's first rows, names,
  shapes and placement kept): every request has seq_len tokens, block tables
  ceil(seq_len / 16) wide, each input set its own compact cache of just the
  attended pages, in shuffled order;
- serving-shaped rows (names ``srv_*`` and ``swa128_srv_*``): ragged
  lengths from fixed-seed distributions, batches padded with seq_len-0 rows to
  CUDA-graph capture sizes, block tables 8192 wide, every request's blocks drawn
  at random from one shared pool of tens of GB.

The group "models" holds the attention shapes of served models (MODELS):
per model a b1 and a b8 uniform row, a b32 uniform row and a serving-shaped
row (the lengths of ``srv_b32_logu32k``), and for gpt-oss its sliding-window
layers (``swa128_oss120_*``).

The group "spec" holds speculative-decoding calls: rows with ``q_tokens`` Q =
2, 4 and 8 query tokens per request (names ``<row>_q<Q>``), twins of a few
core shapes (G 8, D 128, sinks). Query token i of a request of seq_len L sits
at position L - Q + i and attends causally; the K/V bytes a call needs are
those of the union of its tokens' spans, counted once per (request, kv head):
with a window W, the last W + Q - 1 positions (clipped to L).

Every row has an fp8 twin (``<name>_fp8``): the same lengths, block
tables and queries on an e4m3 cache holding the same values quantized.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
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
# A CUDA error that leaves the context unusable: nothing after it can run.
FATAL_ERROR = re.compile(r"CUDA error|illegal memory access|illegal instruction|unspecified launch failure|"
                         r"misaligned address|device-side assert|cudaErrorLaunchFailure|"
                         r"an illegal memory access")
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
    group: str = "legacy"  # "legacy", "serving", "models" or "custom"
    gqa: int = GQA  # query heads per kv head (G)
    head_dim: int = HEAD_DIM  # D
    sinks: bool = True  # fp32 sinks [H], or None
    model: str = ""  # the model whose attention shape this is
    q_tokens: int = 1  # Q query tokens per request (q and out [B, Q, H, D] when Q > 1)

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return self.lengths if self.lengths is not None else (self.seq_len,) * self.batch

    @property
    def num_heads(self) -> int:
        return self.gqa * self.kv_heads

    @property
    def scale(self) -> float:
        """The softmax scale, head_dim ** -0.5."""
        return self.head_dim**-0.5

    @property
    def shape(self) -> str:
        """G, D and sinks (and Q when > 1), e.g. "G8 D128 sinks" or "G8 D128 sinks Q4"."""
        return (f"G{self.gqa} D{self.head_dim} " + ("sinks" if self.sinks else "no sinks")
                + (f" Q{self.q_tokens}" if self.q_tokens > 1 else ""))

    @property
    def kv_window(self) -> int | None:
        """The window of the positions a call reads: the union over the Q
        query tokens of their windows is the last W + Q - 1 positions (all
        of them without a window), the span one token would attend with
        window W + Q - 1. Lengths, pages, block tables and bytes use it."""
        return None if self.window is None else self.window + self.q_tokens - 1

    @property
    def width(self) -> int:
        return self.table_width or S.table_pages(self.seq_len)

    @property
    def elem_bytes(self) -> int:
        return ELEM_BYTES[self.kv_dtype]

    @property
    def page_bytes(self) -> int:
        """One (block, kv head) page: 16 tokens x 2 D elements."""
        return PAGE_TOKENS * 2 * self.head_dim * self.elem_bytes

    @property
    def summary(self) -> S.LengthSummary:
        """Lengths, and attended positions and pages of the union of each
        request's query tokens' spans (kv_window)."""
        return S.LengthSummary.of(self.seq_lens, self.kv_window)

    @property
    def attended(self) -> int:
        """Attended positions per kv head (each request's union over its
        query tokens), summed over requests."""
        return self.summary.attended_tokens

    @property
    def kv_bytes(self) -> int:
        """Attended K+V bytes a call needs: positions x kv heads x 2 D x element size."""
        return self.attended * self.kv_heads * 2 * self.head_dim * self.elem_bytes

    @property
    def qo_bytes(self) -> int:
        """q read + out written, bf16."""
        return 2 * self.batch * self.q_tokens * self.num_heads * self.head_dim * 2

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
        model = f" ({self.model})" if self.model else ""
        return (f"B={self.batch} kvH={self.kv_heads} {self.shape}{model}{lens}{win} table "
                f"{self.width} wide, {self.placement} placement, {self.kv_dtype}")


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


@dataclass(frozen=True)
class Model:
    """A served model's decode attention shape (per GPU at tensor parallelism ``tp``)."""

    tag: str  # the rows' name prefix
    name: str
    tp: int
    gqa: int
    head_dim: int
    kv_heads: int
    sinks: bool
    windows: tuple[int, ...] = ()  # sliding-window layers' windows


# Query heads / kv heads / head dim of the public configs, per GPU at ``tp``.
MODELS = (
    Model("oss120", "gpt-oss-120b", 1, 8, 64, 8, True, (128,)),  # 64 / 8 heads, D 64, sinks
    Model("llama8b", "Llama-3.1-8B", 1, 4, 128, 8, False),  # 32 / 8
    Model("qwen235tp4", "Qwen3-235B-A22B", 4, 16, 128, 1, False),  # 64 / 4 at TP4: 16 / 1
    Model("glm45", "GLM-4.5", 1, 12, 128, 8, False),  # 96 / 8
    Model("minimax2", "MiniMax-M2", 1, 6, 128, 8, False),  # 48 / 8
    Model("qwen35", "Qwen3.5", 1, 8, 256, 2, False),  # full-attention layers: 16 / 2, D 256
)
# The serving row's lengths: those of srv_b32_logu32k (same seed), so that a
# model's row compares with the G 8, D 128 one.
MODEL_SERVING_LENGTHS = ("srv_b32_logu32k", 32, 100, 32768, 2101)


def model_rows(models=MODELS) -> list[Row]:
    """The group "models": per model, uniform rows b1 (8k tokens; 32k with
    1-2 kv heads, whose bytes per token are 4-8x fewer), b8 at 32k and b32 at
    8k, a serving-shaped row (32 log-uniform 100..32768, the lengths of
    srv_b32_logu32k, pool-placed), then each window's sliding-window twins of
    b1, b32 and the serving row."""
    _, n, lo, hi, seed = MODEL_SERVING_LENGTHS
    rows = []
    for m in models:
        shape = dict(group="models", gqa=m.gqa, head_dim=m.head_dim, sinks=m.sinks,
                     model=m.name + (f", TP{m.tp}" if m.tp > 1 else ""))
        b1_len = 8192 if m.kv_heads >= 8 else 32768
        own = [Row(f"{m.tag}_b1_l{_k(b1_len)}", 1, m.kv_heads, b1_len, **shape),
               Row(f"{m.tag}_b8_l32k", 8, m.kv_heads, 32768, **shape),
               Row(f"{m.tag}_b32_l8k", 32, m.kv_heads, 8192, **shape)]
        srv = dataclasses.replace(
            serving_row(f"{m.tag}_srv_b32_logu32k", S.log_uniform(n, lo, hi, seed),
                        f"log-uniform {lo}..{hi}", kv_heads=m.kv_heads), **shape)
        rows += own + [srv]
        for w in m.windows:
            rows += [dataclasses.replace(r, name=f"swa{w}_{r.name}", window=w)
                     for r in (own[0], own[2], srv)]
    return rows


# The group "spec": query tokens per request, and the core shapes whose twins
# at each count run (G 8, D 128, sinks, the shapes' own lengths and placement).
SPEC_Q_TOKENS = (2, 4, 8)
SPEC_BASES = ("b1_l8k", "b32_l1k", "srv_s24_r20_1k8k", "swa128_b16_l8k", "h1_b8_l8k")


def with_q_tokens(row: Row, q_tokens: int, group: str | None = None) -> Row:
    """``row`` with ``q_tokens`` query tokens per request, named ``<name>_q<Q>``."""
    return dataclasses.replace(row, name=f"{row.name}_q{q_tokens}", q_tokens=q_tokens,
                               group=group or row.group)


def spec_rows(q_tokens=SPEC_Q_TOKENS, bases=SPEC_BASES) -> list[Row]:
    """The group "spec" (speculative decoding): each base at each Q of
    ``q_tokens``, the base's lengths, tables and placement: ``b1_l8k`` (one
    request, 8 kv heads), ``b32_l1k`` (32 x 1024, where the Q query rows per
    kv head weigh most against the bytes), ``srv_s24_r20_1k8k`` (serving:
    20 uniform 1024..8192 + 4 padding rows, pool-placed), ``swa128_b16_l8k``
    (a 128-token window: W + Q - 1 positions read) and ``h1_b8_l8k`` (1 kv
    head, a TP-8 shard)."""
    known = {r.name: r for r in core_rows() + [Row("b32_l1k", 32, 8, 1024)]}
    return [with_q_tokens(known[b], q, "spec") for b in bases for q in q_tokens]


def core_rows() -> list[Row]:
    """The benchmark's original rows (G 8, D 128, sinks): legacy, then serving."""
    return legacy_rows() + serving_rows()


def default_grid() -> list[Row]:
    """Every bf16 row: the core rows, the models', then the spec rows (the
    fp8 twins come from with_twins)."""
    return core_rows() + model_rows() + spec_rows()


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
          "core": lambda r: r.group in ("legacy", "serving"), "models": lambda r: r.group == "models",
          "spec": lambda r: r.group == "spec", "all": lambda r: True}
# What runs without --rows: the core rows, the workload of older runs (an
# older build serves only their shapes). The models: --rows models; the
# speculative-decoding rows: --rows spec; every row: --rows all (longer than
# the default --budget-s allows).
DEFAULT_GROUP = "core"


def parse_custom_row(spec: str) -> Row:
    """``B,kvH,L[,W[,G,D[,S[,Q]]]]`` (W 0 or absent: full attention; G query heads
    per kv head, default 8; D the head dim, default 128; S 1: sinks (default), 0: none;
    Q query tokens per request, 1 to 8, default 1)."""
    parts = [int(x) for x in spec.split(",")]
    if len(parts) not in (3, 4, 6, 7, 8) or min(parts[:3]) < 1 or (len(parts) >= 4 and parts[3] < 0):
        raise ValueError(f"custom row must be B,kvH,L[,W[,G,D[,S[,Q]]]] with positive B, kvH, L, "
                         f"got {spec!r}")
    batch, kv_heads, seq_len = parts[:3]
    if 8 % kv_heads:
        raise ValueError(f"custom row: kv heads must divide 8, got {kv_heads}")
    window = parts[3] if len(parts) >= 4 and parts[3] > 0 else None
    gqa, head_dim = parts[4:6] if len(parts) >= 6 else (GQA, HEAD_DIM)
    sinks = bool(parts[6]) if len(parts) >= 7 else True
    q_tokens = parts[7] if len(parts) == 8 else 1
    if gqa < 1 or head_dim not in (64, 128, 256):
        raise ValueError(f"custom row: G must be >= 1 and D one of 64, 128, 256, got {gqa}, {head_dim}")
    if not 1 <= q_tokens <= 8:
        raise ValueError(f"custom row: Q must be 1 to 8, got {q_tokens}")
    name = f"b{batch}_h{kv_heads}_l{_k(seq_len)}" + (f"_w{window}" if window else "")
    if (gqa, head_dim, sinks) != (GQA, HEAD_DIM, True):
        name += f"_g{gqa}_d{head_dim}" + ("" if sinks else "_nosinks")
    if q_tokens > 1:
        name += f"_q{q_tokens}"
    return Row(name, batch, kv_heads, seq_len, window, group="custom", gqa=gqa, head_dim=head_dim,
               sinks=sinks, q_tokens=q_tokens)


def select_rows(names: str | None, quick: bool = False, kv_dtypes=KV_DTYPES) -> list[Row]:
    """Rows by comma-separated names, shell patterns (``srv_*``), groups
    (legacy, serving, core, models, spec, all) or ``custom:B,kvH,L[,W[,G,D[,S[,Q]]]]``
    (';'-separated when several), the quick subset, or DEFAULT_GROUP; each
    with its twins in ``kv_dtypes``. A name ending in _fp8 selects that twin
    alone."""
    grid = default_grid()
    by_name = {r.name: r for r in grid}
    if not names:
        base = ([by_name[n] for n in QUICK_ROWS] if quick
                else [r for r in grid if GROUPS[DEFAULT_GROUP](r)])
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


# The draft probe (bench_gpu.draft_probe) of rows of Q > 1 query tokens: its
# block tables' width (300 tokens need 19 pages) and its requests' lengths.
PROBE_WIDTH = 32


def probe_lengths(q_tokens: int) -> tuple[int, ...]:
    """The probe's requests: one of exactly Q tokens (token 0 at position 0
    sees itself alone), one of Q + 5, and two longer ones (61, and 300, past
    a 128-token window)."""
    return (q_tokens, q_tokens + 5, 61, 300)


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
