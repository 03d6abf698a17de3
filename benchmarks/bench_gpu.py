"""GPU side of the decode benchmark: input sets, a float64 reference, timing
(CUDA-graph replay and eager loops), the HBM read ceiling and the
implementations under test (Flint, FlashInfer XQA / batch decode, torch SDPA).
Imported only when a CUDA GPU is there."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from bench_grid import GQA, HEAD_DIM, PAGE_TOKENS, SCALE, Row, format_config

REPO = Path(__file__).resolve().parents[1]
FLINT_ENV = "FLINT_LAUNCH_CONFIG"


# --- inputs -----------------------------------------------------------------------------


@dataclass
class InputSet:
    q: torch.Tensor  # [B, Hq, 128] bf16
    kv: torch.Tensor  # [num_blocks, kvH, 16, 256] bf16, only attended pages allocated
    block_tables: torch.Tensor  # [B, num_pages] int32, shuffled block ids


@dataclass
class RowInputs:
    row: Row
    sets: list[InputSet]
    seq_lens: torch.Tensor  # [B] int32, all = L
    sinks: torch.Tensor  # [Hq] fp32
    dense: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


def make_inputs(row: Row, n_sets: int, seed: int, device) -> RowInputs:
    """Random bf16 unit-variance q/K/V per set; each set its own cache whose
    blocks are the attended pages of every request, in shuffled order. Block
    table entries left of a sliding window (never attended) point at random
    blocks of the same set, so a kernel that reads them still reads finite
    data."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    B, H, P = row.batch, row.kv_heads, row.pages_touched
    sets = []
    for _ in range(n_sets):
        q = torch.randn(B, row.num_heads, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
        kv = torch.randn(row.num_blocks, H, PAGE_TOKENS, 2 * HEAD_DIM, generator=g, device=device,
                         dtype=torch.bfloat16)
        perm = torch.randperm(row.num_blocks, generator=g, device=device).to(torch.int32)
        bt = torch.empty(B, row.num_pages, dtype=torch.int32, device=device)
        bt[:, row.start_page:] = perm.view(B, P)
        if row.start_page > 0:
            bt[:, : row.start_page] = torch.randint(
                0, row.num_blocks, (B, row.start_page), generator=g, device=device, dtype=torch.int32)
        sets.append(InputSet(q, kv, bt))
    seq_lens = torch.full((B,), row.seq_len, dtype=torch.int32, device=device)
    # Sinks around log(attended positions): the sink takes a large share of the
    # softmax, so a kernel (or a call) that drops it fails the check.
    sinks = (math.log(row.attended) + torch.randn(row.num_heads, generator=g, device=device)).float()
    return RowInputs(row, sets, seq_lens, sinks)


def _attended_rows(row: Row, kv: torch.Tensor, bt_row: torch.Tensor) -> torch.Tensor:
    """[kvH, attended, 256] rows of one request, in position order."""
    pages = kv[bt_row[row.start_page:].long()]  # [P, kvH, 16, 256]
    x = pages.permute(1, 0, 2, 3).reshape(row.kv_heads, -1, 2 * HEAD_DIM)
    off = row.start_tok - row.start_page * PAGE_TOKENS
    return x[:, off: off + row.attended]


def build_dense(inp: RowInputs) -> None:
    """Unpaged contiguous K, V [B, kvH, attended, 128] per set, for SDPA."""
    row = inp.row
    inp.dense = []
    for s in inp.sets:
        k = torch.empty(row.batch, row.kv_heads, row.attended, HEAD_DIM, dtype=torch.bfloat16,
                        device=s.kv.device)
        v = torch.empty_like(k)
        for b in range(row.batch):
            x = _attended_rows(row, s.kv, s.block_tables[b])
            k[b].copy_(x[..., :HEAD_DIM])
            v[b].copy_(x[..., HEAD_DIM:])
        inp.dense.append((k, v))


# --- reference and check ----------------------------------------------------------------


def check_requests(row: Row) -> list[int]:
    return sorted({0, row.batch - 1})


def reference(inp: RowInputs, with_sinks: bool) -> dict[int, torch.Tensor]:
    """float64 outputs [Hq, 128] of set 0 for the checked requests."""
    row, s = inp.row, inp.sets[0]
    refs = {}
    for b in check_requests(row):
        x = _attended_rows(row, s.kv, s.block_tables[b])
        outs = []
        for h in range(row.kv_heads):
            xh = x[h].double()
            k, v = xh[:, :HEAD_DIM], xh[:, HEAD_DIM:]
            qh = s.q[b, h * GQA:(h + 1) * GQA].double()  # [8, 128]
            logits = (qh @ k.T) * SCALE  # [8, attended]
            m = logits.amax(-1, keepdim=True)
            if with_sinks:
                sk = inp.sinks[h * GQA:(h + 1) * GQA].double().unsqueeze(-1)
                m = torch.maximum(m, sk)
            p = torch.exp(logits - m)
            den = p.sum(-1, keepdim=True)
            if with_sinks:
                den = den + torch.exp(sk - m)
            outs.append((p @ v) / den)
        refs[b] = torch.cat(outs, 0)
    return refs


def compare(out: torch.Tensor, refs: dict[int, torch.Tensor], tol: float) -> tuple[bool, float, str]:
    """max |out - ref| / max |ref| over the checked requests; NaN/Inf fail."""
    worst, detail = 0.0, ""
    for b, ref in refs.items():
        o = out[b].double()
        if not torch.isfinite(o).all():
            bad = int((~torch.isfinite(o)).sum())
            return False, float("nan"), f"request {b}: {bad} non-finite outputs"
        err = (o - ref).abs()
        rel = float(err.max()) / max(float(ref.abs().max()), 1e-30)
        if rel > worst:
            idx = int(err.argmax())
            head, dim = divmod(idx, HEAD_DIM)
            worst = rel
            detail = (f"request {b} head {head} dim {dim}: got {float(o.flatten()[idx]):.5g}, "
                      f"ref {float(ref.flatten()[idx]):.5g}")
    return worst <= tol, worst, detail


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
        import bench_triton_read as tr

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


class Unavailable(Exception):
    """An implementation that cannot run here (reason in the message)."""


@dataclass
class Impl:
    """Per-set zero-argument callables, each returning the [B, Hq, 128] output
    (a view of it is fine); ``sinks`` says whether the result includes them."""

    fns: list
    sinks: bool = True
    note: str = ""
    prefill: list = field(default_factory=list)  # outputs to poison before the check


def import_flint():
    try:
        import flint_attention
    except ImportError:
        sys.path.insert(0, str(REPO / "python"))
        try:
            import flint_attention
        except ImportError as e:
            raise Unavailable(f"flint_attention not importable (build it first): {e}") from e
    return flint_attention.flint_decode_attention


def make_flint(inp: RowInputs) -> Impl:
    op = import_flint()
    row = inp.row
    fns, outs = [], []
    for s in inp.sets:
        out = torch.empty_like(s.q)
        outs.append(out)
        fns.append(functools.partial(op, s.q, s.kv, s.block_tables, inp.seq_lens, inp.sinks,
                                     row.window, SCALE, out))
    return Impl(fns, True, "", outs)


@contextlib.contextmanager
def environ(env: dict):
    """The environment variables ``env`` set inside the block, as they were
    after it (the launcher reads FLINT_* at every call)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def flint_with_env(impl: Impl, env: dict) -> Impl:
    """Wrap each call so the environment variables ``env`` are set while it
    runs (eagerly, or while a graph captures it: the graph keeps the launch
    the launcher chose then)."""

    def wrap(f):
        def call():
            with environ(env):
                return f()
        return call

    note = " ".join(f"{k}={v}" for k, v in env.items())
    return Impl([wrap(f) for f in impl.fns], True, note, impl.prefill)


def flint_with_config(impl: Impl, cfg) -> Impl:
    return flint_with_env(impl, {FLINT_ENV: format_config(cfg)})


def make_flint_nopdl(inp: RowInputs) -> Impl:
    """flint launched without programmatic dependent launch (FLINT_PDL=0)."""
    return flint_with_env(make_flint(inp), {"FLINT_PDL": "0"})


_FI_WORKSPACE: dict = {}


def import_flashinfer():
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/flint-bench-flashinfer")
    try:
        import flashinfer
        import flashinfer.decode  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any import failure means missing)
        raise Unavailable(f"flashinfer not importable: {type(e).__name__}: {e}") from e
    return flashinfer


def flashinfer_workspace(device) -> torch.Tensor:
    # Zeroed once (XQA's semaphores must start at 0; they reset themselves).
    ws = _FI_WORKSPACE.get(device)
    if ws is None:
        ws = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
        _FI_WORKSPACE[device] = ws
    return ws


def make_xqa(inp: RowInputs) -> Impl:
    """FlashInfer's Hopper decode (XQA) on zero-copy K/V views of our cache."""
    fi = import_flashinfer()
    from flashinfer.decode import trtllm_batch_decode_with_kv_cache

    row = inp.row
    ws = flashinfer_workspace(inp.seq_lens.device)
    fns, outs = [], []
    for s in inp.sets:
        out = torch.empty_like(s.q)
        outs.append(out)
        fns.append(functools.partial(
            trtllm_batch_decode_with_kv_cache,
            query=s.q,
            kv_cache=(s.kv[..., :HEAD_DIM], s.kv[..., HEAD_DIM:]),
            workspace_buffer=ws,
            block_tables=s.block_tables,
            seq_lens=inp.seq_lens,
            max_seq_len=row.seq_len,
            bmm1_scale=SCALE,
            bmm2_scale=1.0,
            window_left=row.window - 1 if row.window else -1,
            out=out,
            sinks=inp.sinks,
            kv_layout="HND",
            enable_pdl=True,
            backend="xqa",
        ))
    return Impl(fns, True, f"flashinfer {fi.__version__} backend=xqa", outs)


def make_fi_batch_decode(inp: RowInputs, max_sets: int = 64) -> Impl:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper (tensor cores, HND):
    the fallback when XQA cannot run. It ignores sinks. One planned wrapper
    per set (each holds 16 MB of index buffers), at most ``max_sets``."""
    fi = import_flashinfer()
    row = inp.row
    dev = inp.seq_lens.device
    ws = flashinfer_workspace(dev)
    sets = inp.sets[:max_sets]
    indptr = torch.arange(row.batch + 1, dtype=torch.int32, device=dev) * row.num_pages
    last = torch.full((row.batch,), (row.seq_len - 1) % PAGE_TOKENS + 1, dtype=torch.int32, device=dev)
    fns, outs = [], []
    for s in sets:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="HND", use_tensor_cores=True)
        w.plan(indptr, s.block_tables.reshape(-1).contiguous(), last, row.num_heads, row.kv_heads,
               HEAD_DIM, PAGE_TOKENS, window_left=row.window - 1 if row.window else -1,
               q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=SCALE)
        out = torch.empty_like(s.q)
        outs.append(out)
        fns.append(functools.partial(w.run, s.q, (s.kv[..., :HEAD_DIM], s.kv[..., HEAD_DIM:]), out=out))
    note = f"flashinfer {fi.__version__} BatchDecodeWithPagedKVCacheWrapper, NO sinks"
    if len(sets) < len(inp.sets):
        note += f", rotates {len(sets)} of {len(inp.sets)} sets ({len(sets) * row.set_bytes / 1e6:.0f} MB)"
    return Impl(fns, False, note, outs)


def make_sdpa(inp: RowInputs) -> Impl:
    """torch SDPA on a dense unpaged copy (attended positions only), no sinks.
    Fused backends only (the math fallback would materialize 8x K/V); first
    enable_gqa=True, else the 8 query heads of a kv head as 8 query rows of
    one head (the same math, plain MHA shapes)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    row = inp.row
    if not inp.dense:
        build_dense(inp)
    B, Hq, H = row.batch, row.num_heads, row.kv_heads

    def gqa_call(q, k, v):
        with sdpa_kernel(fused):
            o = F.scaled_dot_product_attention(q.view(B, Hq, 1, HEAD_DIM), k, v, scale=SCALE,
                                               enable_gqa=True)
        return o.view(B, Hq, HEAD_DIM)

    def rows_call(q, k, v):
        with sdpa_kernel(fused):
            o = F.scaled_dot_product_attention(q.view(B, H, GQA, HEAD_DIM), k, v, scale=SCALE)
        return o.view(B, Hq, HEAD_DIM)

    errors = []
    for name, call in (("enable_gqa=True", gqa_call), ("q heads as rows per kv head", rows_call)):
        s0, (k0, v0) = inp.sets[0], inp.dense[0]
        try:
            call(s0.q, k0, v0)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (try the next formulation)
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        fns = [functools.partial(call, s.q, k, v) for s, (k, v) in zip(inp.sets, inp.dense)]
        note = f"torch {torch.__version__} SDPA ({name}), dense copy, NO sinks"
        return Impl(fns, False, note)
    raise Unavailable("; ".join(errors))
