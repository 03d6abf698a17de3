"""Device side of the decode benchmark: input sets, the output check, timing
(CUDA-graph replay, eager loops), the HBM read ceiling and the
implementations under test (Flint, Flint with a forced plan, FlashInfer XQA, vLLM's
Triton unified attention, torch SDPA).

Importable without a GPU: --dry-run and the CPU tests build the same inputs on
the CPU (with a small pool) and run the peers' argument mapping there.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from benchmarks import bench_grid as grid
from benchmarks.bench_grid import HEAD_DIM, PAGE_TOKENS, Row
from benchmarks.peers import peer_vllm, peer_xqa
# The inputs' fp8 scales and the bounds outputs are held to (Flint: the
# package's; peers: looser ones that still catch wrong semantics).
from benchmarks.peers.checks import FLINT_TOL, K_SCALE, PEER_TOL, V_SCALE
from flint_attention.testing import Tolerance, error_report, make_paged_inputs, reference_decode_attention
from flint_attention.testing import serving as S
from flint_attention.testing.inputs import FP8_MAX

FP8 = torch.float8_e4m3fn
DTYPES = {"bf16": torch.bfloat16, "fp8": FP8}


class Unavailable(Exception):
    """An implementation that cannot run here (reason in the message)."""


class Mismatch(Exception):
    """An implementation whose output differs from the float64 reference in
    a check made while setting it up (draft_probe); reported as a mismatch,
    never timed."""


# --- inputs -----------------------------------------------------------------------------


def cache_view(storage: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """A pool's storage as the HND cache [num_blocks, kv_heads, 16, 2 * head_dim]
    (as many whole blocks as fit). For head_dim 128 and kv heads dividing the
    pool's, the very view KVPool.view gives."""
    per_block = kv_heads * PAGE_TOKENS * 2 * head_dim
    flat = storage.view(-1)
    n = flat.numel() // per_block
    return flat[: n * per_block].view(n, kv_heads, PAGE_TOKENS, 2 * head_dim)


def quantize_as(src: torch.Tensor, dst: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
                head_dim: int, chunk_bytes: int = 1 << 30) -> None:
    """dst (fp8) = src (bf16) / scale with K's scale on the first head_dim
    elements of each 2 * head_dim row and V's on the rest, saturated at +-448
    (quantize_fp8's arithmetic): the fp8 twin of a cache read with this head dim."""
    rows_src = src.view(-1, 2 * head_dim)
    rows_dst = dst.view(-1, 2 * head_dim)
    step = max(1, chunk_bytes // (2 * head_dim * 6))  # the fp32 temporary dominates
    for start in range(0, rows_src.shape[0], step):
        a, b = rows_src[start:start + step], rows_dst[start:start + step]
        b[:, :head_dim] = (a[:, :head_dim].float() / k_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        b[:, head_dim:] = (a[:, head_dim:].float() / v_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def fp8_twin(bf16: S.KVPool, k_scale: torch.Tensor, v_scale: torch.Tensor, head_dim: int) -> S.KVPool:
    """An fp8 pool holding ``bf16``'s values quantized for caches of ``head_dim``
    (head_dim 128: KVPool.quantized_twin itself)."""
    if head_dim == HEAD_DIM:
        return bf16.quantized_twin(k_scale, v_scale)
    twin = S.KVPool(bf16.num_blocks, bf16.max_kv_heads, FP8, bf16.storage.device)
    quantize_as(bf16.storage, twin.storage, k_scale, v_scale, head_dim)
    return twin


class SharedPools:
    """The serving rows' KV pool: one bf16 allocation of ``nbytes`` filled
    once with unit-variance values and, when fp8 rows run, its quantized fp8
    twin (the same values, block for block, at per-tensor scales). The pool
    is viewed as the cache of any kv head count and head dim; the fp8 twin
    is quantized again, in place, when a row reads it with another head dim
    than the last (K's and V's halves of a row sit elsewhere)."""

    def __init__(self, nbytes: int, device, seed: int, fp8: bool):
        self.bf16 = S.KVPool.of_bytes(nbytes, 8, torch.bfloat16, device)
        self.bf16.fill_random(seed)
        self.k_scale = torch.tensor([K_SCALE], dtype=torch.float32, device=device)
        self.v_scale = torch.tensor([V_SCALE], dtype=torch.float32, device=device)
        self.fp8 = self.bf16.quantized_twin(self.k_scale, self.v_scale) if fp8 else None
        self.fp8_head_dim = HEAD_DIM

    def pool(self, kv_dtype: str, head_dim: int = HEAD_DIM) -> S.KVPool:
        p = self.bf16 if kv_dtype == "bf16" else self.fp8
        if p is None:
            raise RuntimeError("the fp8 pool was not made (no fp8 rows were selected)")
        if kv_dtype == "fp8" and head_dim != self.fp8_head_dim:
            quantize_as(self.bf16.storage, self.fp8.storage, self.k_scale, self.v_scale, head_dim)
            self.fp8_head_dim = head_dim
        return p


@dataclass
class RowInputs:
    """One row's inputs, shared by its bf16 row and fp8 twin: the same
    lengths, q sets, block tables and sinks; the cache of each dtype."""

    row: Row  # the bf16 row
    seq_lens: torch.Tensor  # [B] int32
    sinks: torch.Tensor | None  # [Hq] fp32, None for a row without sinks
    qs: list[torch.Tensor]  # per set [B, Hq, D] bf16 ([B, Q, Hq, D] for Q > 1 query tokens)
    tables: list[torch.Tensor]  # per set [B, width] int32
    caches: dict[str, torch.Tensor]  # kv dtype -> [num_blocks, kvH, 16, 2 D]
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    n_sets: dict[str, int]  # sets each dtype rotates over (a prefix of qs / tables)
    owned: list = field(default_factory=list)  # compact pools, freed with the inputs
    dense: list = field(default_factory=list)  # SDPA's (K, V) per set
    refs: dict = field(default_factory=dict)

    @property
    def device(self):
        return self.seq_lens.device

    def cache(self, kv_dtype: str) -> torch.Tensor:
        return self.caches[kv_dtype]

    def scales(self, kv_dtype: str):
        return (self.k_scale, self.v_scale) if kv_dtype == "fp8" else (None, None)

    def sets(self, kv_dtype: str) -> range:
        return range(self.n_sets[kv_dtype])


def draw_tables(row: Row, num_blocks: int, n_sets: int, seed: int) -> torch.Tensor:
    """[n_sets, B, width] int32 (CPU): the row's placements. Pool rows draw
    every request's attended pages at random from the whole pool; compact rows
    give each set its own range of exactly its attended blocks, in shuffled
    order. Attended: the union of the request's query tokens' spans
    (Row.kv_window)."""
    if row.placement == "pool":
        return S.draw_block_tables(row.seq_lens, row.kv_window, num_blocks, row.width, n_sets, seed)
    per_set = row.attended_blocks
    assert num_blocks >= per_set * n_sets, (num_blocks, per_set, n_sets)
    tables = []
    for s in range(n_sets):
        t = S.draw_block_tables(row.seq_lens, row.kv_window, per_set, row.width, 1, seed + s)
        tables.append(t + s * per_set)
    return torch.cat(tables)


def build_inputs(row: Row, n_sets: dict[str, int], shared: SharedPools | None, seed: int,
                 device) -> RowInputs:
    """Inputs for ``row`` (bf16) and the twins in ``n_sets`` (dtype -> sets)."""
    total = max(n_sets.values())
    owned = []
    D = row.head_dim
    if row.placement == "pool":
        assert shared is not None, "pool rows need the shared pools"
        pools = {d: shared.pool(d, D) for d in n_sets}
        k_scale, v_scale = shared.k_scale, shared.v_scale
    else:
        # Pool blocks of [kvH, 16, 256] enough for the attended blocks of
        # [kvH, 16, 2 D] (head dim 128: one for one, as the rows always had).
        blocks = -(-total * row.attended_blocks * D // HEAD_DIM)
        bf16 = S.KVPool(blocks, row.kv_heads, torch.bfloat16, device)
        bf16.fill_random(seed)
        k_scale = torch.tensor([K_SCALE], dtype=torch.float32, device=device)
        v_scale = torch.tensor([V_SCALE], dtype=torch.float32, device=device)
        pools = {"bf16": bf16}
        if "fp8" in n_sets:
            pools["fp8"] = fp8_twin(bf16, k_scale, v_scale, D)
        owned = list(pools.values())
        if "bf16" not in n_sets:
            pools.pop("bf16")
    caches = {d: cache_view(p.storage, row.kv_heads, D) for d, p in pools.items()}
    num_blocks = next(iter(caches.values())).shape[0]
    tables = draw_tables(row, num_blocks, total, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    # One query token: q [B, Hq, D]; Q > 1 (speculative decoding): [B, Q, Hq, D],
    # as flint_attention.testing.make_paged_inputs(q_tokens=Q) makes them.
    rows = (row.batch, row.num_heads) if row.q_tokens == 1 else (row.batch, row.q_tokens, row.num_heads)
    qs = [torch.randn(*rows, D, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(total)]
    # Sinks around log(median attended positions): the sink takes a large share
    # of the softmax, so a kernel (or a call) that drops it fails the check.
    attended = [len(S.attended_span(n, row.window)) for n in row.seq_lens if n > 0]
    centre = math.log(statistics.median(attended)) if attended else 0.0
    sinks = (centre + torch.randn(row.num_heads, generator=gen, device=device)).float() if row.sinks else None
    return RowInputs(
        row=row,
        seq_lens=torch.tensor(row.seq_lens, dtype=torch.int32, device=device),
        sinks=sinks, qs=qs, tables=[t.to(device) for t in tables],
        caches=caches, k_scale=k_scale, v_scale=v_scale, n_sets=dict(n_sets), owned=owned,
    )


def reference(inp: RowInputs, kv_dtype: str, idx: list[int]) -> torch.Tensor:
    """float64 [len(idx), Hq, D] ([len(idx), Q, Hq, D]) outputs of set 0 for requests ``idx``,
    gathering only their attended pages (on the inputs' device); the row's
    G, D and sinks (None: no sink term) follow from the tensors."""
    key = (kv_dtype, tuple(idx))
    if key not in inp.refs:
        ks, vs = inp.scales(kv_dtype)
        sel = torch.tensor(idx, dtype=torch.long, device=inp.device)
        inp.refs[key] = reference_decode_attention(
            inp.qs[0][sel], inp.cache(kv_dtype), inp.tables[0][sel], inp.seq_lens[sel], inp.sinks,
            inp.row.window, inp.row.scale, ks, vs)
    return inp.refs[key]


def check(out: torch.Tensor, inp: RowInputs, kv_dtype: str, idx: list[int], tol: Tolerance,
          sinkless: bool = False):
    """(ok, ErrorReport) of ``out`` (set 0's output) on requests ``idx``."""
    ref = sdpa_reference(inp, idx) if sinkless else reference(inp, kv_dtype, idx)
    sel = torch.tensor(idx, dtype=torch.long, device=out.device)
    rep = error_report(out[sel], ref, tol)
    return rep.ok(tol), rep


# --- timing -----------------------------------------------------------------------------


def graph_time(fns, n_calls: int, warmup: int, reps: int) -> tuple[float, list[float]]:
    """Median µs per call over ``reps`` replays of one CUDA graph holding
    ``n_calls`` back-to-back calls that rotate over ``fns`` (one per set)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:  # eager warm-up on the capture stream
            f()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(n_calls):
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n_calls)
    del graph
    return statistics.median(times), times


def wall_time(fns, n_calls: int, warmup: int, reps: int) -> tuple[float, list[float]]:
    """graph_time's CPU stand-in (bench_decode --device cpu, a test of the
    run's plumbing): median wall-clock µs per call of loops of ``n_calls``."""
    for _ in range(warmup):
        for i in range(n_calls):
            fns[i % len(fns)]()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(n_calls):
            fns[i % len(fns)]()
        times.append((time.perf_counter() - t0) * 1e6 / n_calls)
    return statistics.median(times), times


def eager_time(fns, n_calls: int, warmup: int, reps: int) -> float:
    """Median µs per call of plain eager loops (CUDA events around the loop):
    includes the Python and launch overhead a graph removes."""

    def loop():
        for i in range(n_calls):
            fns[i % len(fns)]()

    return _event_time_us(loop, warmup, reps) / n_calls


def _event_time_us(fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def measure_ceiling(gib: float, log) -> dict:
    """Best HBM read bandwidth of a few plain streaming reads of one buffer of
    ``gib`` GiB: torch reductions and our Triton 16-byte-vector read-reduce."""
    nbytes = int(gib * 2**30) // (1 << 20) * (1 << 20)
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    cands = [
        ("torch.sum(bf16)", lambda: torch.sum(x)),
        ("torch.sum(x.view(fp32))", lambda: x.view(torch.float32).sum()),
        ("x.view(int64).sum()", lambda: x.view(torch.int64).sum()),
    ]
    try:
        from benchmarks import bench_triton_read as tr

        for block, warps, per_sm, cg in tr.VARIANTS:
            name = f"triton read-reduce BLOCK={block} warps={warps} progs/SM={per_sm}" + (" .cg" if cg else "")
            cands.append((name, tr.make_read(x, block, warps, per_sm, cg)))
    except Exception as e:  # noqa: BLE001 (report and go on with torch kernels)
        log(f"triton read kernel unavailable: {type(e).__name__}: {e}")
    results = []
    for name, fn in cands:
        try:
            us = _event_time_us(fn, warmup=2, reps=10)
            tbps = nbytes / (us * 1e-6) / 1e12
            results.append({"kernel": name, "us": us, "tbps": tbps})
            log(f"  ceiling candidate {name}: {tbps:.3f} TB/s")
        except Exception as e:  # noqa: BLE001
            results.append({"kernel": name, "error": f"{type(e).__name__}: {e}"})
            log(f"  ceiling candidate {name} failed: {type(e).__name__}: {e}")
    del x
    torch.cuda.empty_cache()
    ok = [r for r in results if "tbps" in r]
    if not ok:
        raise RuntimeError("no read kernel ran: cannot measure the HBM ceiling")
    best = max(ok, key=lambda r: r["tbps"])
    return {"tbps": best["tbps"], "kernel": best["kernel"], "bytes": nbytes, "candidates": results}


# --- implementations --------------------------------------------------------------------


@dataclass
class Impl:
    """Per-set zero-argument callables; each returns its set's output (None:
    it is ``prefill[set]``). The first set's output is checked on requests
    ``check_idx`` against ``tol`` (``sinkless``: against a reference without
    sinks)."""

    fns: list
    tol: Tolerance
    check_idx: list[int]
    note: str = ""
    prefill: list = field(default_factory=list)  # outputs poisoned (NaN) before the check
    sinkless: bool = False
    probe_err: float | None = None  # Q > 1: the draft probe's relative error (draft_probe)


def import_flint():
    try:
        import flint_attention
    except ImportError as e:
        raise Unavailable(f"flint_attention not importable (build it first): {e}") from e
    return flint_attention.flint_decode_attention


def import_plans():
    """flint_attention.testing.plans (the test-only launch plans), or
    Unavailable("plans unavailable: ...")."""
    try:
        from flint_attention.testing import plans
    except Exception as e:  # noqa: BLE001 (an absent module is reported, never fatal)
        raise Unavailable(f"plans unavailable: {type(e).__name__}: {e}") from e
    return plans


def plan_of(fn, *args):
    """``fn(*args)`` for a plans function; a build without the CUDA kernel has
    no test-only extension to load, which makes the plans unavailable."""
    try:
        return fn(*args)
    except ImportError as e:
        raise Unavailable(f"plans unavailable: {type(e).__name__}: {e}") from e


# --- query tokens: the draft probe ------------------------------------------------------


def draft_probe(row: Row, kv_dtype: str, device, call, tol: Tolerance) -> float:
    """For Q > 1 query tokens per request: ``call(inputs) -> out`` on a small
    batch of the row's shape (G, D, sinks, window, Q, cache dtype) whose
    requests are barely longer than the draft (grid.probe_lengths), checked
    against the float64 reference. The row's own check cannot tell a wrong
    mask within the draft on long requests (Q - 1 positions among thousands
    move the output by less than a peer's bound); these short ones can.
    Returns the relative error (Frobenius); raises Mismatch."""
    fp8 = kv_dtype == "fp8"
    lens = grid.probe_lengths(row.q_tokens)
    p = make_paged_inputs(len(lens), list(lens), row.kv_heads, row.window, device, poison=False,
                          max_blocks=grid.PROBE_WIDTH, seed=17, kv_dtype=DTYPES[kv_dtype],
                          k_scale=K_SCALE if fp8 else None, v_scale=V_SCALE if fp8 else None,
                          group=row.gqa, head_dim=row.head_dim, q_tokens=row.q_tokens, with_sinks=row.sinks)
    out = call(p)
    if device.type == "cuda":
        torch.cuda.synchronize()
    ref = reference_decode_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, p.sinks, row.window,
                                     row.scale, p.k_scale, p.v_scale)
    rep = error_report(out, ref, tol)
    if not rep.ok(tol):
        raise Mismatch(f"draft probe (requests of {'/'.join(map(str, lens))} tokens, {row.q_tokens} query "
                       f"tokens each) differs from the float64 reference: {rep.describe(tol)}")
    return rep.rel_fro


def _outs(inp: RowInputs, kv_dtype: str) -> list[torch.Tensor]:
    return [torch.empty_like(inp.qs[s]) for s in inp.sets(kv_dtype)]


def first_line(e: BaseException) -> str:
    """An exception's message's first line (its type's name if empty)."""
    lines = str(e).strip().splitlines()
    return lines[0].strip() if lines else type(e).__name__


def not_served(e: Exception) -> Unavailable:
    """What a shape the build does not serve is reported as: missing, with
    "not served: <the error's first line>" (never an estimate)."""
    return Unavailable(f"not served: {first_line(e)}")


def try_call(fn, device) -> None:
    """One call of ``fn``: a Flint build raises on shapes its kernels do not
    serve (head dim, query heads per kv head, sinks), which makes the row's
    Flint column "not served", as a missing peer's. A CUDA error that breaks
    the context propagates (the worker is restarted)."""
    try:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 (the op's refusal of a shape)
        if grid.FATAL_ERROR.search(str(e)):
            raise
        raise not_served(e) from e


def make_flint(inp: RowInputs, kv_dtype: str) -> Impl:
    op = import_flint()
    row, kv = inp.row, inp.cache(kv_dtype)
    ks, vs = inp.scales(kv_dtype)
    outs = _outs(inp, kv_dtype)
    fns = [functools.partial(op, inp.qs[s], kv, inp.tables[s], inp.seq_lens, inp.sinks, row.window,
                             row.scale, outs[s], k_scale=ks, v_scale=vs) for s in inp.sets(kv_dtype)]
    try_call(fns[0], inp.device)
    probe = None
    if row.q_tokens > 1:
        probe = draft_probe(row, kv_dtype, inp.device, lambda p: op(
            p.q, p.kv_cache, p.block_tables, p.seq_lens, p.sinks, row.window, row.scale, p.out,
            k_scale=p.k_scale, v_scale=p.v_scale), FLINT_TOL)
    return Impl(fns, FLINT_TOL, grid.check_requests(row), prefill=outs, probe_err=probe)


def make_flint_split(inp: RowInputs, kv_dtype: str) -> Impl:
    """The split kernels' plan for the row, whatever the op's own choice."""
    return _make_flint_forced(inp, kv_dtype, balanced=False)


def make_flint_balanced(inp: RowInputs, kv_dtype: str) -> Impl:
    """The balanced kernel's plan, whatever the op's own choice for the row."""
    return _make_flint_forced(inp, kv_dtype, balanced=True)


def _make_flint_forced(inp: RowInputs, kv_dtype: str, balanced: bool) -> Impl:
    """A plan forced through the test-only plans: the split kernels' rules
    (plans.split_rules_plan, named by the testing extension's op) or the balanced
    kernel."""
    plans = import_plans()
    row, kv = inp.row, inp.cache(kv_dtype)
    ks, vs = inp.scales(kv_dtype)
    outs = _outs(inp, kv_dtype)
    fns, names = [], set()
    try:
        for s in inp.sets(kv_dtype):
            plan = (plan_of(plans.balanced_plan, kv) if balanced
                    else plan_of(plans.split_rules_plan, inp.qs[s], kv, row.window))
            names.add(plan.name)
            fns.append(functools.partial(plans.run_with_plan, plan, inp.qs[s], kv, inp.tables[s],
                                         inp.seq_lens, inp.sinks, row.window, row.scale, outs[s],
                                         k_scale=ks, v_scale=vs))
    except Unavailable:
        raise
    except Exception as e:  # noqa: BLE001 (no plan for a shape the build does not serve)
        if grid.FATAL_ERROR.search(str(e)):
            raise
        raise not_served(e) from e
    try_call(fns[0], inp.device)
    return Impl(fns, FLINT_TOL, grid.check_requests(row),
                ("balanced plan " if balanced else "split plan ") + "/".join(sorted(names)),
                prefill=outs)


def plan_balance(inp: RowInputs, kv_dtype: str, split: bool = False) -> dict:
    """{"plan", "max_pages", "mean_pages", "ratio"} of flint's default plan
    (or the split kernels' plan) on this row, or {"error": ...}."""
    try:
        plans = import_plans()
        row, q, kv = inp.row, inp.qs[0], inp.cache(kv_dtype)
        plan = plan_of(plans.split_rules_plan if split else plans.default_plan, q, kv, row.window)
        # Pages of each request's union span (W + Q - 1 positions with a window).
        mx, mean = plan.balance(list(row.seq_lens), row.kv_window, row.kv_heads)
        return {"plan": plan.name, "max_pages": int(mx), "mean_pages": float(mean),
                "ratio": float(mx) / float(mean) if mean else None}
    except Exception as e:  # noqa: BLE001 (a balance is information, never fatal)
        msg = str(e) if isinstance(e, Unavailable) else f"{type(e).__name__}: {e}"
        return {"error": msg[:500]}


_FI_WORKSPACE: dict = {}
PREBUILD: peer_xqa.Prebuild | None = None  # set by the worker when it starts one


def flashinfer_workspace(device) -> torch.Tensor:
    # Zeroed once (XQA's semaphores must start at 0; they reset themselves).
    ws = _FI_WORKSPACE.get(device)
    if ws is None:
        ws = torch.zeros(peer_xqa.WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _FI_WORKSPACE[device] = ws
    return ws


def xqa_variant(row: Row) -> tuple:
    """The XQA module a row's calls need (peer_xqa.variant)."""
    return peer_xqa.variant(row.kv_dtype == "fp8", row.window is not None, row.head_dim, row.gqa,
                            row.q_tokens)


def _into(fn, kw: dict, out):
    """fn(**kw), then the caller's out: XQA returns its own [B Q, H, D] view
    of it, while the checks compare Flint's [B, Q, H, D] buffer."""
    fn(**kw)
    return out


def make_xqa(inp: RowInputs, kv_dtype: str, prebuild_timeout: float = 300.0) -> Impl:
    """FlashInfer's Hopper decode (XQA) on zero-copy K/V views of the cache."""
    try:
        fi = peer_xqa.import_flashinfer()
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache
    except Exception as e:  # noqa: BLE001 (any import failure means missing)
        raise Unavailable(f"flashinfer not importable: {type(e).__name__}: {e}") from e
    row, kv = inp.row, inp.cache(kv_dtype)
    fp8 = kv_dtype == "fp8"
    if PREBUILD is not None:
        PREBUILD.wait(prebuild_timeout)
        why = PREBUILD.failed.get(xqa_variant(row))
        if why:
            raise Unavailable(why)
    ws = flashinfer_workspace(inp.device)
    outs = _outs(inp, kv_dtype)
    # Q > 1: the causal draft mask, one for all sets (read-only).
    mask = peer_xqa.causal_mask(row.batch, row.q_tokens, inp.device) if row.q_tokens > 1 else None
    fns = []
    for s in inp.sets(kv_dtype):
        kw = peer_xqa.call_kwargs(inp.qs[s], kv, ws, inp.tables[s], inp.seq_lens, inp.sinks, row.window,
                                  row.scale, outs[s], max(row.seq_lens),
                                  K_SCALE if fp8 else None, V_SCALE if fp8 else None, mask=mask)
        fns.append(functools.partial(_into, trtllm_batch_decode_with_kv_cache, kw, outs[s]))
    note = f"flashinfer {fi.__version__} backend=xqa" + (" (fp8 cache, bf16 q/out)" if fp8 else "")
    checked = None
    if row.q_tokens > 1:

        def probe(p):
            kw = peer_xqa.call_kwargs(p.q, p.kv_cache, ws, p.block_tables, p.seq_lens, p.sinks, row.window,
                                      row.scale, p.out, int(p.seq_lens.max()), K_SCALE if fp8 else None,
                                      V_SCALE if fp8 else None,
                                      mask=peer_xqa.causal_mask(len(p.seq_lens), row.q_tokens, inp.device))
            trtllm_batch_decode_with_kv_cache(**kw)
            return p.out

        try:
            checked = draft_probe(row, kv_dtype, inp.device, probe, PEER_TOL[kv_dtype])
        except Mismatch:
            raise
        except Exception as e:  # noqa: BLE001 (a refusal of the call: the row's column says why)
            if grid.FATAL_ERROR.search(str(e)):
                raise
            raise Unavailable(f"a call with {row.q_tokens} query tokens per request raised: "
                              f"{first_line(e)}") from e
        note += f", q_len_per_req={row.q_tokens} with a causal draft mask"
    return Impl(fns, PEER_TOL[kv_dtype], grid.check_requests(row, peers=True), note, prefill=outs,
                probe_err=checked)


def make_vllm(inp: RowInputs, kv_dtype: str) -> Impl:
    """vLLM's Triton unified attention (.peers/vllm_triton) on views of the cache."""
    try:
        m = peer_vllm.load()
    except peer_vllm.PeerUnavailable as e:
        raise Unavailable(str(e)) from e
    row, kv = inp.row, inp.cache(kv_dtype)
    ks, vs = inp.scales(kv_dtype)
    scratch = peer_vllm.make_scratch(row.num_heads, row.kv_heads, inp.device, row.head_dim, row.q_tokens)
    outs = _outs(inp, kv_dtype)
    fns = []
    for s in inp.sets(kv_dtype):
        kw = peer_vllm.decode_kwargs(m, inp.qs[s], kv, inp.tables[s], inp.seq_lens, inp.sinks,
                                     row.window, row.scale, outs[s], scratch, max(row.seq_lens), ks, vs)
        fns.append(functools.partial(_call_then_return, m.unified_attention, kw, outs[s]))
    src = peer_vllm.source_info()
    split = peer_vllm.uses_split_kernel(row.batch, row.kv_heads, row.q_tokens, row.gqa)
    path = "3D split-K" if split else "2D"
    checked = None
    if row.q_tokens > 1:

        def probe(p):  # the row's kernel (split-K or 2D) on the probe's batch
            scr = (peer_vllm.make_scratch(row.num_heads, row.kv_heads, inp.device, row.head_dim, row.q_tokens)
                   if split else peer_vllm.NO_SPLIT)
            m.unified_attention(**peer_vllm.decode_kwargs(
                m, p.q, p.kv_cache, p.block_tables, p.seq_lens, p.sinks, row.window, row.scale, p.out, scr,
                int(p.seq_lens.max()), p.k_scale, p.v_scale))
            return p.out

        path += f", max_seqlen_q={row.q_tokens}"
        checked = draft_probe(row, kv_dtype, inp.device, probe, PEER_TOL[kv_dtype])
    note = f"vllm {src.get('vllm_version', '?')} triton_unified_attention ({path})"
    return Impl(fns, PEER_TOL[kv_dtype], grid.check_requests(row, peers=True), note, prefill=outs,
                probe_err=checked)


def _call_then_return(fn, kwargs: dict, out: torch.Tensor) -> torch.Tensor:
    fn(**kwargs)
    return out


def build_dense(inp: RowInputs) -> None:
    """Unpaged contiguous K, V [B, kvH, attended, D] per set (bf16, uniform rows)."""
    row, kv = inp.row, inp.cache("bf16")
    D = row.head_dim
    span = S.attended_span(row.seq_len, row.window)
    pages = S.page_span(row.seq_len, row.window)
    off = span.start - pages.start * PAGE_TOKENS
    inp.dense = []
    for s in inp.sets("bf16"):
        k = torch.empty(row.batch, row.kv_heads, len(span), D, dtype=torch.bfloat16, device=inp.device)
        v = torch.empty_like(k)
        for b in range(row.batch):
            x = kv[inp.tables[s][b, pages.start:pages.stop].long()]  # [P, kvH, 16, 2 D]
            x = x.permute(1, 0, 2, 3).reshape(row.kv_heads, -1, 2 * D)[:, off:off + len(span)]
            k[b].copy_(x[..., :D])
            v[b].copy_(x[..., D:])
        inp.dense.append((k, v))


def sdpa_reference(inp: RowInputs, idx: list[int]) -> torch.Tensor:
    """float64 outputs without sinks (SDPA has none), requests ``idx`` of set 0."""
    key = ("nosinks", tuple(idx))
    if key not in inp.refs:
        sel = torch.tensor(idx, dtype=torch.long, device=inp.device)
        no_sinks = None if inp.sinks is None else torch.full_like(inp.sinks, -math.inf)
        inp.refs[key] = reference_decode_attention(
            inp.qs[0][sel], inp.cache("bf16"), inp.tables[0][sel], inp.seq_lens[sel],
            no_sinks, inp.row.window, inp.row.scale)
    return inp.refs[key]


def make_sdpa(inp: RowInputs, kv_dtype: str) -> Impl:
    """torch SDPA on a dense unpaged copy (attended positions only), no sinks,
    for the uniform bf16 rows. Fused backends only (the math fallback would
    materialize G x K/V); first enable_gqa=True, else the G query heads of a kv
    head as G query rows of one head (the same math, plain MHA shapes)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    row = inp.row
    if kv_dtype != "bf16" or row.lengths is not None or row.q_tokens > 1:
        raise Unavailable("sdpa runs on the uniform bf16 rows of one query token only")
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    if not inp.dense:
        build_dense(inp)
    B, Hq, H, G, D, scale = row.batch, row.num_heads, row.kv_heads, row.gqa, row.head_dim, row.scale

    def gqa_call(q, k, v):
        with sdpa_kernel(fused):
            o = F.scaled_dot_product_attention(q.view(B, Hq, 1, D), k, v, scale=scale, enable_gqa=True)
        return o.view(B, Hq, D)

    def rows_call(q, k, v):
        with sdpa_kernel(fused):
            o = F.scaled_dot_product_attention(q.view(B, H, G, D), k, v, scale=scale)
        return o.view(B, Hq, D)

    errors = []
    for name, call in (("enable_gqa=True", gqa_call), ("q heads as rows per kv head", rows_call)):
        (k0, v0) = inp.dense[0]
        try:
            call(inp.qs[0], k0, v0)
            if inp.device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (try the next formulation)
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        fns = [functools.partial(call, inp.qs[s], k, v) for s, (k, v) in zip(inp.sets("bf16"), inp.dense)]
        note = f"torch {torch.__version__} SDPA ({name}), dense copy, NO sinks"
        return Impl(fns, PEER_TOL["bf16"], grid.check_requests(row, peers=True), note, sinkless=True)
    raise Unavailable("; ".join(errors))
