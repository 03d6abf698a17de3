"""FlashInfer's Hopper decode (XQA) as a benchmark peer: the argument mapping
for bf16 and fp8 (e4m3) caches, and a parallel build of its JIT modules.

Read from the source of flashinfer-python 0.6.18.post1 (decode.py,
xqa.py, jit/xqa.py, data/csrc/xqa/*), not run here (no GPU):

- ``trtllm_batch_decode_with_kv_cache(..., backend="xqa")`` takes the cache as
  a (K, V) tuple of [num_pages, kv_heads, 16, D] tensors with
  ``kv_layout="HND"`` (any strides but the last: zero-copy views of Flint's
  [num_blocks, kv_heads, 16, 2 D] cache split at D), a [B, max_pages] int32
  block table, seq_lens, ``sinks`` as fp32 [num_q_heads] (reshaped to
  [kv_heads, G] inside; None: no sinks, the kernels test the pointer),
  ``window_left = W - 1`` (-1: none) and ``out`` of q's dtype. D comes from
  q.shape[-1], G from num_q_heads // kv_heads.
- Shapes (jit/xqa.py, data/csrc/xqa/mha.h): D a multiple of 16 up to 512
  (mha.h: 64, 128, 256, 512 or 576), any G (HEAD_GRP_SIZE, compiled in); the
  bf16 cache runs mha.cu (G rows padded to 16), the fp8 cache on sm_90 the
  Hopper kernel mha_sm90.cu (D <= 256; G padded to a multiple of 8). So the
  benchmark's shapes (D 64, 128, 256; G 4, 6, 8, 12, 16) are all in range;
  whether each compiles is seen when its module builds.
- It hands XQA ``kv_scale = bmm2_scale * o_scale`` and ``q_scale = bmm1_scale /
  kv_scale * sqrt(head_dim)``; the kernel scales Q.K^T by ``q_scale * kv_scale
  / sqrt(head_dim)`` when the cache is quantized (by ``q_scale / sqrt(head_dim)``
  otherwise) and the output by ``kv_scale`` (quantized cache only). So:
    bf16 cache: bmm1_scale = scale, bmm2_scale = 1;
    fp8 cache:  bmm1_scale = scale * k_scale, bmm2_scale = v_scale
  gives logits scale * q.(k_stored * k_scale) and out = P.(v_stored * v_scale):
  per-tensor k and v scales work although XQA has one kv scale. The scales go in
  as Python floats (baked into the launch; the benchmark's are constant). A
  tensor bmm2_scale would add small torch kernels to every call.
- An e4m3 cache with a bf16 query selects the module built with
  CACHE_ELEM_ENUM=2 and, on sm_90, the Hopper fp8 kernel (mha_sm90.cu), which
  also takes sinks and the sliding window at q_len 1. That kernel feeds Q and P
  to fp8 tensor cores, so its error against float64 is larger than a bf16
  kernel's: the benchmark checks peers with a looser bound (checks.PEER_TOL).
- Q query tokens per request (speculative decoding, ``q_len_per_req=Q``,
  Q = 2..8): xqa_batch_decode_with_kv_cache views ``query`` [B * Q, H, D] as
  [B, Q, H, D] and xqa() reads q and out through their pointers only, so
  Flint's [B, Q, H, D] q and out go in as zero-copy [B * Q, H, D] views. XQA
  then wants a draft mask (xqa() asserts one: "Mask is required for
  speculative decoding"), uint16 [B, Q, 2 * ceil(Q / 32)], bit j of row i set
  when draft token i sees draft token j (one 32-bit word per 32 draft tokens;
  FlashInfer's own tests build the causal one, j <= i, as ``causal_mask``
  does here). The kernel (data/csrc/xqa/mha.cu, SPEC_DEC with
  IS_SPEC_DEC_TREE=0, which jit/xqa.py sets) puts draft row r at position
  seq_len - Q + r -- seq_lens counts the draft tokens, as Flint's does --
  reads every position before the draft unmasked, applies the mask's bits to
  the last Q positions and, with a window, starts row r's window at
  seq_len - Q + r + 1 - W. With the causal mask that is Flint's semantics
  (token i at p = seq_len - Q + i attends [max(0, p + 1 - W), p + 1)); the
  benchmark also probes it on short requests (bench_gpu.draft_probe). Sinks
  and windows are taken at Q > 1; on an fp8 cache xqa() then runs the
  generic kernel (mha.cu), not the Hopper fp8 one, whenever there are sinks,
  a window, or Q x G <= 32 (FlashInfer: mha_sm90.cu's spec-decode paths have
  precision issues there), so every spec row's fp8 twin runs mha.cu. Each Q
  is its own JIT module (SPEC_DEC=1, and SPEC_Q_SEQ_LEN=Q when Q x G <= 32).
- One JIT module per (q dtype, cache dtype, page 16, D, G, sliding or not, out
  dtype, Q): four for the core rows (D 128, G 8), one per shape, dtype and
  window more for the models' rows, four per Q for the spec rows. ``Prebuild`` compiles them in one ninja
  run (flashinfer.jit.core.build_jit_specs, what FlashInfer's AOT build uses,
  here with ninja's -k 0 so that one module's compile error does not stop
  the others) without loading them; the first call then finds them built and
  only loads. A module that did not build makes its rows' XQA column missing
  with the build's error instead of building it again at each first call.
"""

from __future__ import annotations

import os
import threading
import time

HEAD_DIM = 128
PAGE_TOKENS = 16
GQA = 8
WORKSPACE_BYTES = 256 << 20  # XQA takes the first 8 MB as semaphores, the rest as scratch


def import_flashinfer():
    """flashinfer and its decode module (JIT cache under /tmp unless set)."""
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/flint-bench-flashinfer")
    import flashinfer
    import flashinfer.decode  # noqa: F401

    return flashinfer


def scales(kv_fp8: bool, scale: float, k_scale: float | None, v_scale: float | None) -> tuple[float, float]:
    """(bmm1_scale, bmm2_scale) for a bf16 or fp8 cache (see the module docstring)."""
    if not kv_fp8:
        return scale, 1.0
    return scale * float(k_scale), float(v_scale)


def effective_scales(bmm1_scale: float, bmm2_scale: float, head_dim: int = HEAD_DIM,
                     kv_fp8: bool = True) -> tuple[float, float]:
    """What XQA applies, (logit scale per stored q.k, output scale per stored
    v), from FlashInfer's xqa_batch_decode_with_kv_cache and the kernels'
    qkScale / voScale (o_scale 1)."""
    kv_scale = bmm2_scale * 1.0
    q_scale = bmm1_scale / kv_scale * head_dim**0.5
    if not kv_fp8:
        return q_scale / head_dim**0.5, 1.0
    return q_scale * kv_scale / head_dim**0.5, kv_scale


def causal_mask(batch: int, q_len: int, device=None):
    """XQA's speculative-decoding draft mask for a linear causal draft:
    uint16 [batch, q_len, 2 * ceil(q_len / 32)], bit j of row i's 32-bit
    word j // 32 set when j <= i (draft token i sees draft tokens 0..i), the
    same for every request (FlashInfer's tests' generate_causal_mask)."""
    import torch

    words = -(-q_len // 32)
    i = torch.arange(q_len).view(q_len, 1, 1)
    j = torch.arange(words * 32).view(1, words, 32)
    word = ((j <= i).to(torch.int64) << (j % 32)).sum(-1)  # [q_len, words], < 2**32
    word = (word + 2**31) % 2**32 - 2**31  # as int32 bits
    word = word.to(torch.int32).unsqueeze(0).expand(batch, q_len, words).contiguous().to(device)
    # Little-endian: each 32-bit word is two uint16, its low half first (a
    # view: uint16 tensors need no kernels of their own).
    return word.view(torch.uint16)  # [batch, q_len, 2 * words]


def call_kwargs(q, kv_cache, workspace, block_tables, seq_lens, sinks, window, scale, out,
                max_seq_len: int, k_scale: float | None = None, v_scale: float | None = None,
                mask=None) -> dict:
    """Keyword arguments of trtllm_batch_decode_with_kv_cache for one call on
    Flint's inputs (HND cache [num_blocks, kv_heads, 16, 2 D], K | V; sinks
    [H] fp32 or None). q and out [B, H, D], or [B, Q, H, D] for Q query
    tokens per request: passed as [B * Q, H, D] views with q_len_per_req=Q
    and ``mask`` (causal_mask(B, Q)) as the draft mask."""
    fp8 = str(kv_cache.dtype) == "torch.float8_e4m3fn"
    bmm1, bmm2 = scales(fp8, scale, k_scale, v_scale)
    d = kv_cache.shape[-1] // 2
    spec = {}
    if q.dim() == 4:
        batch, q_len, heads, dim = q.shape
        q, out = q.view(batch * q_len, heads, dim), out.view(batch * q_len, heads, dim)
        if q_len > 1:
            if mask is None:
                raise ValueError("XQA with several query tokens per request needs the draft mask")
            spec = dict(q_len_per_req=q_len, mask=mask)
    return dict(
        query=q,
        kv_cache=(kv_cache[..., :d], kv_cache[..., d:]),
        workspace_buffer=workspace,
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_seq_len=max_seq_len,
        bmm1_scale=bmm1,
        bmm2_scale=bmm2,
        window_left=window - 1 if window else -1,
        out=out,
        sinks=sinks,
        kv_layout="HND",
        enable_pdl=True,
        backend="xqa",
        **spec,
    )


def variant(kv_fp8: bool, sliding: bool, head_dim: int = HEAD_DIM, group: int = GQA, q_len: int = 1) -> tuple:
    """What selects an XQA module for the benchmark's calls: (kv_fp8, sliding, D, G, Q)."""
    return (bool(kv_fp8), bool(sliding), int(head_dim), int(group), int(q_len))


def describe(v: tuple) -> str:
    kv_fp8, sliding, head_dim, group, q_len = v
    return (f"{'fp8' if kv_fp8 else 'bf16'}{' sliding' if sliding else ''} D{head_dim} G{group}"
            + (f" Q{q_len}" if q_len > 1 else ""))


def module_args(kv_fp8: bool, sliding: bool, head_dim: int = HEAD_DIM, group: int = GQA,
                q_len: int = 1) -> tuple:
    """get_xqa_module / gen_xqa_module arguments of one call shape (uniform
    query length: no ragged Q)."""
    import torch

    kv = torch.float8_e4m3fn if kv_fp8 else torch.bfloat16
    return (torch.bfloat16, kv, PAGE_TOKENS, head_dim, group, sliding, torch.bfloat16, q_len, False)


def _run_ninja_keep_going(workdir, ninja_file, verbose: bool) -> None:
    """flashinfer.jit.cpp_ext.run_ninja with -k 0: every module that can build does."""
    import subprocess

    from flashinfer.jit import cpp_ext

    workdir.mkdir(parents=True, exist_ok=True)
    command = ["ninja", "-v", "-k", "0", "-C", str(workdir.resolve()), "-f", str(ninja_file.resolve())]
    workers = cpp_ext._get_num_workers()
    if workers is not None:
        command += ["-j", str(workers)]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          cwd=str(workdir.resolve()), text=True)
    if done.returncode != 0:
        raise RuntimeError("Ninja build failed. Ninja output:\n" + (done.stdout or "")[-20000:])


def build_error(output: str, name: str) -> str:
    """The first compiler error line of module ``name`` in ninja's output ('' if none)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("FAILED:") and name in line:
            for follow in lines[i + 1:i + 400]:
                if "error" in follow and not follow.startswith(("FAILED:", "[")):
                    return follow.strip()[:300]
            return line.strip()[:300]
    return ""


class Prebuild:
    """Compiles the XQA modules for ``variants`` [variant(...)] in a
    background thread; ``wait()`` before the first XQA call (calls must not
    build the same module at the same time). ``failed``: variant -> why, for
    the modules that did not build."""

    def __init__(self, variants, log):
        self.variants, self.log = [variant(*v) for v in variants], log
        self.error: str | None = None
        self.failed: dict = {}
        self.seconds: float | None = None
        self.waited = 0.0  # seconds callers spent in wait()
        self._thread = threading.Thread(target=self._run, name="xqa-prebuild", daemon=True)

    def start(self) -> Prebuild:
        if self.variants:
            self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.time()
        specs = []
        try:
            from unittest import mock

            import_flashinfer()
            from flashinfer.jit import core
            from flashinfer.jit.core import build_jit_specs
            from flashinfer.jit.xqa import gen_xqa_module

            specs = [gen_xqa_module(*module_args(*v)) for v in self.variants]
            self.log(f"flashinfer: building {len(specs)} XQA modules in one ninja run "
                     f"({', '.join(describe(v) for v in self.variants)})")
            with mock.patch.object(core, "run_ninja", _run_ninja_keep_going):
                build_jit_specs(specs)
        except Exception as e:  # noqa: BLE001 (the modules that built are used)
            error = f"{type(e).__name__}: {e}"
            self.error = error[:300] + (f" ... {error[-1500:]}" if len(error) > 300 else "")
            self.log(f"flashinfer prebuild failed ({error[:300]})")
            for v, spec in zip(self.variants, specs):
                try:
                    built = spec.is_compiled
                except Exception:  # noqa: BLE001
                    built = False
                if not built:
                    why = build_error(error, spec.name) or error.splitlines()[0][:300]
                    self.failed[v] = f"XQA module {describe(v)} did not build: {why}"
                    self.log(f"  {self.failed[v]}")
            if not specs:  # not even specified: each module builds at its first call
                self.log("each XQA module builds at its first call")
        self.seconds = time.time() - t0
        if self.error is None:
            self.log(f"flashinfer: XQA modules built in {self.seconds:.0f} s")

    def wait(self, timeout: float) -> float:
        """Seconds waited; raises TimeoutError if still building after ``timeout``."""
        if not self._thread.is_alive():
            return 0.0
        t0 = time.time()
        self._thread.join(timeout)
        self.waited += time.time() - t0
        if self._thread.is_alive():
            raise TimeoutError(f"the XQA prebuild still runs after {timeout:.0f} s")
        return time.time() - t0


def trace_call(kw: dict) -> dict:
    """Runs trtllm_batch_decode_with_kv_cache(**kw) on CPU tensors down to
    the compiled XQA module's entry, which is replaced by a recorder (as are
    the two device queries on the way: SM count 132, compute capability 9.0).
    Returns what the module would be built from and called with."""
    import importlib
    from unittest import mock

    # The modules (flashinfer's package namespace exports functions of these names).
    fd = importlib.import_module("flashinfer.decode")
    fx = importlib.import_module("flashinfer.xqa")

    seen: dict = {}

    class Module:
        def xqa(self, *args):
            names = ("run_sm90_fp8_mha", "sm_count", "num_kv_heads", "sliding_win_size", "q_scale", "output",
                     "rcp_out_scale", "q", "sinks", "k_cache", "v_cache", "k_sf_cache", "v_sf_cache",
                     "page_table", "max_seq_len", "seq_lens", "batch_size", "kv_scale", "semaphores",
                     "workspace_buffer", "enable_pdl", "q_seq_len", "q_cu_seq_lens", "mask")
            seen["call"] = dict(zip(names, args))

    def get_module(*args):
        seen["module"] = args
        return Module()

    with mock.patch.object(fx, "get_compute_capability", lambda device: (9, 0)), \
            mock.patch.object(fx, "get_xqa_module", get_module), \
            mock.patch.object(fd, "get_device_sm_count", lambda device: 132):
        fd.trtllm_batch_decode_with_kv_cache(**kw)
    return seen


def cpu_check() -> str:
    """What can be checked of the XQA mapping without a GPU: the scales give
    the intended logits and output; where flashinfer imports, a call on CPU
    tensors traced down to the XQA module's entry (trace_call): the module is
    the one prebuilt, the fp8 path takes the Hopper fp8 kernel, and the scales,
    window, sinks and cache views arrive as intended."""
    import torch

    scale, ks, vs = HEAD_DIM**-0.5, 4.0 / 448, 8.0 / 448
    for fp8 in (False, True):
        logit, outs = effective_scales(*scales(fp8, scale, ks, vs), kv_fp8=fp8)
        want = (scale * ks, vs) if fp8 else (scale, 1.0)
        assert abs(logit - want[0]) < 1e-9 * want[0] and abs(outs - want[1]) < 1e-12, (fp8, logit, outs)
    try:
        fi = import_flashinfer()
    except Exception as e:  # noqa: BLE001
        return (f"xqa: scale mapping ok; flashinfer not importable here ({type(e).__name__}: "
                f"{str(e)[:200]}), so the call was not traced")
    kvh, batch = 2, 3
    shapes = [(GQA, HEAD_DIM, True), (8, 64, True), (4, 128, False), (12, 128, False), (16, 256, False)]
    for group, d, with_sinks in shapes:
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            fp8 = dtype != torch.bfloat16
            for window in (None, 128):
                kv = torch.zeros(6, kvh, PAGE_TOKENS, 2 * d).to(dtype)
                q = torch.zeros(batch, group * kvh, d, dtype=torch.bfloat16)
                out = torch.empty_like(q)
                sinks = torch.zeros(group * kvh) if with_sinks else None
                kw = call_kwargs(q, kv, torch.zeros(16 << 20, dtype=torch.uint8),
                                 torch.zeros(batch, 4, dtype=torch.int32), torch.ones(batch, dtype=torch.int32),
                                 sinks, window, d**-0.5, out, 64, ks if fp8 else None, vs if fp8 else None)
                seen = trace_call(kw)
                c = seen["call"]
                what = f"{'fp8' if fp8 else 'bf16'} G{group} D{d} sinks {with_sinks} window {window}"
                assert seen["module"] == module_args(fp8, window is not None, d, group), (what, seen["module"])
                assert c["run_sm90_fp8_mha"] == fp8 and c["sliding_win_size"] == (window or 0), what
                logit = c["q_scale"] * (c["kv_scale"] if fp8 else 1.0) / d**0.5
                assert abs(logit - d**-0.5 * (ks if fp8 else 1.0)) < 1e-9, (what, logit)
                assert not fp8 or abs(c["kv_scale"] - vs) < 1e-12, (what, c["kv_scale"])
                if with_sinks:
                    assert tuple(c["sinks"].shape) == (kvh, group), what
                else:
                    assert c["sinks"] is None, what
                assert c["num_kv_heads"] == kvh, what
                k, v = c["k_cache"], c["v_cache"]  # NHD views of the HND cache, no copy
                assert k.data_ptr() == kv.data_ptr() and v.data_ptr() == kv.data_ptr() + d * kv.element_size()
                assert tuple(k.shape) == (6, PAGE_TOKENS, kvh, d) and k.stride() == (
                    kvh * PAGE_TOKENS * 2 * d, 2 * d, PAGE_TOKENS * 2 * d, 1), what
                assert c["output"].data_ptr() == out.data_ptr() and c["batch_size"] == batch, what
    # Q query tokens per request (the spec rows: G 8, D 128, sinks): q and out
    # as zero-copy [B * Q, H, D] views, q_len_per_req, the causal draft mask,
    # the module built for that Q, and the generic kernel for fp8 (sinks).
    q_lens = (2, 4, 8)
    for q_len in q_lens:
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            fp8 = dtype != torch.bfloat16
            for window in (None, 128):
                kv = torch.zeros(6, kvh, PAGE_TOKENS, 2 * HEAD_DIM).to(dtype)
                q = torch.zeros(batch, q_len, GQA * kvh, HEAD_DIM, dtype=torch.bfloat16)
                out = torch.empty_like(q)
                mask = causal_mask(batch, q_len)
                kw = call_kwargs(q, kv, torch.zeros(16 << 20, dtype=torch.uint8),
                                 torch.zeros(batch, 4, dtype=torch.int32),
                                 torch.full((batch,), q_len + 3, dtype=torch.int32), torch.zeros(GQA * kvh),
                                 window, scale, out, 64, ks if fp8 else None, vs if fp8 else None, mask=mask)
                seen = trace_call(kw)
                c = seen["call"]
                what = f"{'fp8' if fp8 else 'bf16'} Q{q_len} window {window}"
                assert seen["module"] == module_args(fp8, window is not None, HEAD_DIM, GQA, q_len), (
                    what, seen["module"])
                assert c["q_seq_len"] == q_len and c["q_cu_seq_lens"] is None, what
                assert c["mask"].data_ptr() == mask.data_ptr() and tuple(c["mask"].shape) == (batch, q_len, 2)
                assert tuple(c["q"].shape) == (batch, 1, q_len, GQA * kvh, HEAD_DIM), (what, c["q"].shape)
                assert c["q"].data_ptr() == q.data_ptr() and c["output"].data_ptr() == out.data_ptr(), what
                assert c["output"].numel() == out.numel() and c["batch_size"] == batch, what
                assert not c["run_sm90_fp8_mha"], what  # sinks at Q > 1: the generic kernel
                assert c["sliding_win_size"] == (window or 0) and tuple(c["sinks"].shape) == (kvh, GQA), what
    return (f"xqa: scale mapping ok; calls on bf16 and fp8 caches, with and without a window, at "
            f"{', '.join(f'G{g} D{d}' + ('' if si else ' no sinks') for g, d, si in shapes)}, and at G8 D128 "
            f"with {', '.join(map(str, q_lens))} query tokens per request, traced "
            f"through flashinfer {fi.__version__} down to the XQA module: the prebuilt modules, the "
            f"Hopper fp8 kernel for fp8 (the generic one at Q > 1 with sinks), scales, window, sinks, "
            f"the causal draft mask and zero-copy q, out and cache views as intended")
