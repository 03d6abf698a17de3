"""vLLM's Triton unified attention as a benchmark peer, run with torch and
triton only (no vLLM install).

``.peers/vllm_triton/`` holds the two modules copied out of a vLLM wheel by
``extract_vllm_triton.py`` (git-ignored, copied to the GPU machine with the
tree; see benchmarks/peers/README.md). ``load()`` imports them under their vLLM names with
small stand-ins for the vllm modules they touch:

    vllm.envs                  VLLM_BATCH_INVARIANT = False, VLLM_TRITON_USE_TD = None
    vllm.logger                init_logger -> a logging.Logger with debug_once & co.
    vllm.platforms             current_platform: fp8_dtype() = float8_e4m3fn, a CUDA
                               platform whose capability comes from torch
    vllm.triton_utils          triton, tl (the installed triton)
    vllm.v1.kv_cache_interface KVQuantMode (the values the kernel compares against)

``decode_kwargs()`` maps one Flint call to ``unified_attention``'s arguments
the way vLLM 0.33's TritonAttentionImpl.forward does for a decode batch
(read from vllm/v1/attention/backends/triton_attn.py of that wheel):

- cache: vLLM 0.33 hands this backend the cache in the logical order
  [num_blocks, kv_heads, block_size, 2 * head_size] -- Flint's HND layout with K
  in [..., :D] and V in [..., D:] -- and passes the kernel the strided views
  ``kv.transpose(1, 2).split(D, -1)`` ([num_blocks, 16, kv_heads, D] each).
  So the peer reads the very same cache, through views, no copy.
- shapes: any query heads per kv head (num_queries_per_kv; BLOCK_M = 16 rows
  hold 16 // G tokens' heads up to G 16) and head size (padded to a power of
  two, HEAD_SIZE_PADDED); sinks optional (None: USE_SINKS off).
- one query token per request: cu_seqlens_q = arange(B + 1), max_seqlen_q = 1;
  padding rows (seq_len 0) keep their query token, as a CUDA-graph-padded batch
  does; they are not checked (the 3D path leaves their output untouched).
- Q query tokens per request (speculative decoding, Q = 2..8): q and out as
  [B * Q, H, D] (zero-copy views of Flint's [B, Q, H, D]), cu_seqlens_q =
  arange(B + 1) * Q, max_seqlen_q = Q, as vLLM's uniform decode batches of a
  verify step. The kernel puts a request's query tokens at the end of its
  sequence (context_len = seq_len - Q, query token i at context_len + i, keys
  <= that position and, with a window, < W positions before it:
  triton_unified_attention.py / triton_attention_helpers.compute_kv_seq_mask),
  which are Flint's semantics (token i at seq_len - Q + i attends
  [max(0, p + 1 - W), p + 1)).
- sinks: the fp32 [num_q_heads] logits or None; window W: window_size = (W - 1, 0), no
  window: (-1, -1) (TritonAttentionImpl's self.sliding_window).
- fp8 (e4m3) cache: kv_quant_mode FP8_PER_TENSOR, k_descale / v_descale the
  per-tensor scales expanded to [num_seqs, kv_heads] (the kernel reads their
  first element), q stays bf16 and q_descale None.
- split-K ("3D") scratch and threshold as TritonAttentionMetadataBuilder sets them
  with CUDA graphs on: 16 softmax segments, seq_threshold_3D = the capture size
  closest to 128 // kv_heads; batches above it take the 2D kernel. The
  segments' output is [rows, num_heads, 16, next_power_of_2(head_size)].
  The 3D scratch is indexed by query token: with Q tokens per request it gets
  seq_threshold_3D x Q rows, so that the kernel's own rule picks the path
  (3D while num_seqs x cdiv(Q, BLOCK_Q) <= seq_threshold_3D and Q <= 8, with
  BLOCK_Q = 16 // G query tokens per program), not a scratch too small for
  the verify batch.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a file: the repository's packages import as under `python -m`
    sys.path.insert(0, str(REPO))
PEER_DIR = REPO / ".peers" / "vllm_triton"
MODULES = ("triton_attention_helpers", "triton_unified_attention")
PACKAGE = "vllm.v1.attention.ops"
HEAD_DIM = 128

# vllm/v1/attention/backends/triton_attn.py (0.33)
MIN_LAUNCH_GRID_SIZE_2D = 128
# triton_unified_attention.py (0.33): longest query per request of the 3D path
MAX_3D_QUERY_LEN = 8
NUM_PAR_SOFTMAX_SEGMENTS = 16
# vLLM's default cudagraph_capture_sizes (up to 512), which the serving rows pad to.
CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512)


class PeerUnavailable(Exception):
    """The peer's files or its imports are missing (reason in the message)."""


class KVQuantMode(enum.IntEnum):
    """The values of vllm.v1.kv_cache_interface.KVQuantMode the kernel uses."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4

    @property
    def is_per_token_head(self) -> bool:
        return self in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD,
                        KVQuantMode.INT4_PER_TOKEN_HEAD)


class _OnceLogger(logging.LoggerAdapter):
    def __init__(self, name: str):
        super().__init__(logging.getLogger(name), {})
        self._seen: set = set()

    def _once(self, level: int, msg: str, *args, **_scope) -> None:
        if (level, msg, args) not in self._seen:
            self._seen.add((level, msg, args))
            self.log(level, msg, *args)

    def debug_once(self, msg, *args, **kw):
        self._once(logging.DEBUG, msg, *args, **kw)

    def info_once(self, msg, *args, **kw):
        self._once(logging.INFO, msg, *args, **kw)

    def warning_once(self, msg, *args, **kw):
        self._once(logging.WARNING, msg, *args, **kw)


class _CudaPlatform:
    """The few current_platform methods the kernel module calls."""

    def fp8_dtype(self):
        import torch

        return torch.float8_e4m3fn

    def _capability(self):
        import torch

        return torch.cuda.get_device_capability() if torch.cuda.is_available() else None

    def is_device_capability_family(self, family: int) -> bool:
        # vLLM: capability.to_int() // 10 == family // 10, e.g. (10, 3) is family 100.
        cap = self._capability()
        return cap is not None and (cap[0] * 10 + cap[1]) // 10 == family // 10

    def is_device_capability(self, cap) -> bool:
        return self._capability() == tuple(cap)

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False


def _module(name: str, package: bool = False, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    if package:
        m.__path__ = []
    m.__dict__.update(attrs)
    return m


def _stubs(peer_dir: Path) -> dict[str, types.ModuleType]:
    import triton
    import triton.language as tl

    ops = _module(PACKAGE, package=True)
    ops.__path__ = [str(peer_dir)]
    return {
        "vllm": _module("vllm", package=True),
        "vllm.envs": _module("vllm.envs", VLLM_BATCH_INVARIANT=False, VLLM_TRITON_USE_TD=None,
                             VLLM_TRITON_FORCE_FIRST_CONFIG=False),
        "vllm.logger": _module("vllm.logger", init_logger=_OnceLogger),
        "vllm.platforms": _module("vllm.platforms", current_platform=_CudaPlatform()),
        "vllm.triton_utils": _module("vllm.triton_utils", triton=triton, tl=tl, HAS_TRITON=True),
        "vllm.v1": _module("vllm.v1", package=True),
        "vllm.v1.attention": _module("vllm.v1.attention", package=True),
        PACKAGE: ops,
        "vllm.v1.kv_cache_interface": _module("vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode),
    }


def source_info(peer_dir: Path = PEER_DIR) -> dict:
    """MANIFEST.json written by extract_vllm_triton.py ({} if absent)."""
    try:
        return json.loads((peer_dir / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return {}


_LOADED: dict = {}


def load(peer_dir: Path | str | None = None) -> types.ModuleType:
    """The unified-attention module, imported from ``peer_dir`` (default
    .peers/vllm_triton) under stubs. Raises PeerUnavailable."""
    peer_dir = Path(peer_dir) if peer_dir else PEER_DIR
    key = str(peer_dir.resolve())
    if key in _LOADED:
        return _LOADED[key]
    missing = [f"{m}.py" for m in MODULES if not (peer_dir / f"{m}.py").is_file()]
    if missing:
        raise PeerUnavailable(f"{peer_dir} lacks {', '.join(missing)} (benchmarks/peers/README.md "
                              "says how to extract them from a vLLM wheel)")
    if "vllm" in sys.modules and not getattr(sys.modules["vllm"], "_flint_stub", False):
        raise PeerUnavailable("a real vllm package is imported: the stubs would shadow it")
    try:
        stubs = _stubs(peer_dir)
    except ImportError as e:
        raise PeerUnavailable(f"triton not importable: {e}") from e
    stubs["vllm"]._flint_stub = True
    saved = {n: sys.modules.get(n) for n in list(stubs) + [f"{PACKAGE}.{m}" for m in MODULES]}
    sys.modules.update(stubs)
    try:
        module = None
        for name in MODULES:
            full = f"{PACKAGE}.{name}"
            spec = importlib.util.spec_from_file_location(full, peer_dir / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[full] = module
            spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 (an import failure makes the peer missing)
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
        raise PeerUnavailable(f"importing {peer_dir}: {type(e).__name__}: {e}") from e
    for attr in ("unified_attention", "kernel_unified_attention", "reduce_segments"):
        if not hasattr(module, attr):
            raise PeerUnavailable(f"{peer_dir}/triton_unified_attention.py has no {attr}")
    _LOADED[key] = module
    return module


def split_threshold(num_kv_heads: int, capture_sizes=CAPTURE_SIZES) -> int:
    """seq_threshold_3D of TritonAttentionMetadataBuilder with CUDA graphs on:
    the capture size closest to 128 // kv_heads (the first of two equally close)."""
    target = MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
    return min(capture_sizes, key=lambda x: abs(x - target))


def make_scratch(num_heads: int, num_kv_heads: int, device, head_dim: int = HEAD_DIM,
                 q_tokens: int = 1) -> dict:
    """The split-K buffers the metadata builder allocates once (rows =
    seq_threshold_3D x ``q_tokens``, one per query token: max_num_seqs is
    larger in every vLLM default; head size padded to a power of two)."""
    import torch

    threshold = split_threshold(num_kv_heads)
    rows = threshold * q_tokens
    seg = NUM_PAR_SOFTMAX_SEGMENTS
    padded = 1 << (head_dim - 1).bit_length()
    return {
        "seq_threshold_3D": threshold,
        "num_par_softmax_segments": seg,
        "softmax_segm_output": torch.empty(rows, num_heads, seg, padded, dtype=torch.float32,
                                           device=device),
        "softmax_segm_max": torch.empty(rows, num_heads, seg, dtype=torch.float32, device=device),
        "softmax_segm_expsum": torch.empty(rows, num_heads, seg, dtype=torch.float32, device=device),
    }


# unified_attention's scratch arguments for the 2D kernel only (no split-K).
NO_SPLIT = dict(seq_threshold_3D=None, num_par_softmax_segments=None, softmax_segm_output=None,
                softmax_segm_max=None, softmax_segm_expsum=None)


def block_q(gqa: int) -> int:
    """unified_attention's BLOCK_Q: query tokens per program (BLOCK_M = 16
    rows, or G rounded up to a power of two above 16)."""
    block_m = 16 if gqa <= 16 else 1 << (gqa - 1).bit_length()
    return block_m // gqa


def uses_split_kernel(batch: int, num_kv_heads: int, q_tokens: int = 1, gqa: int = 8) -> bool:
    """Whether unified_attention takes its split-K (3D) path for a decode
    batch of ``q_tokens`` query tokens per request (make_scratch's rows)."""
    q_blocks = -(-q_tokens // block_q(gqa))
    return q_tokens <= MAX_3D_QUERY_LEN and batch * q_blocks <= split_threshold(num_kv_heads)


def cache_views(kv_cache):
    """K and V as the [num_blocks, 16, kv_heads, D] views vLLM 0.33 passes
    (the cache's last dim split in halves)."""
    nhd = kv_cache.transpose(1, 2)
    d = kv_cache.shape[-1] // 2
    return nhd[..., :d], nhd[..., d:]


def decode_kwargs(module, q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                  scratch: dict, max_seq_len: int, k_scale=None, v_scale=None) -> dict:
    """unified_attention keyword arguments for one decode call (see the module
    docstring). q and out [B, H, D], or [B, Q, H, D] for Q query tokens per
    request (passed as [B * Q, H, D] views). ``scratch`` from make_scratch
    (with q_tokens=Q); scales are [1] fp32 tensors."""
    import torch

    if q.dim() == 4:
        batch, q_tokens, heads, dim = q.shape
        q, out = q.view(batch * q_tokens, heads, dim), out.view(batch * q_tokens, heads, dim)
    else:
        batch, q_tokens = q.shape[0], 1
    kvh = kv_cache.shape[1]
    k, v = cache_views(kv_cache)
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    if fp8:
        if k_scale is None or v_scale is None:
            raise ValueError("an fp8 cache needs k_scale and v_scale")
        if k_scale.numel() != 1 or v_scale.numel() != 1:
            raise ValueError("the peer takes per-tensor fp8 scales only (KVQuantMode.FP8_PER_TENSOR)")
    one = torch.ones(1, dtype=torch.float32, device=q.device)
    k_descale = (k_scale if fp8 else one).reshape(1, 1).expand(batch, kvh)
    v_descale = (v_scale if fp8 else one).reshape(1, 1).expand(batch, kvh)
    quant = module.KVQuantMode.FP8_PER_TENSOR if fp8 else module.KVQuantMode.NONE
    return dict(
        q=q, k=k, v=v, out=out,
        cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32, device=q.device) * q_tokens,
        max_seqlen_q=q_tokens, seqused_k=seq_lens, max_seqlen_k=max_seq_len,
        softmax_scale=scale, causal=True,
        window_size=(window - 1, 0) if window else (-1, -1),
        block_table=block_tables, softcap=0.0,
        q_descale=None, k_descale=k_descale, v_descale=v_descale,
        sinks=sinks, kv_quant_mode=quant, **scratch,
    )


# --- compiling ahead -----------------------------------------------------------------------


def warm_spec(batch: int, kv_heads: int, window, kv_dtype: str, width: int, gqa: int = 8,
              head_dim: int = HEAD_DIM, sinks: bool = True, q_tokens: int = 1, split: bool | None = None) -> dict:
    """A call shape to compile ahead; ``split`` False: the 2D kernel whatever
    the batch (a call made without split-K scratch), None: the kernel's rule."""
    spec = {"batch": batch, "kv_heads": kv_heads, "window": window, "kv_dtype": kv_dtype, "width": width,
            "gqa": gqa, "head_dim": head_dim, "sinks": sinks}
    if q_tokens > 1:
        spec["q_tokens"] = q_tokens
    if split is not None:
        spec["split"] = bool(split)
    return spec


def spec_split(spec: dict) -> bool:
    """Whether a call shaped like ``spec`` takes the split-K (3D) kernel."""
    rule = uses_split_kernel(spec["batch"], spec["kv_heads"], spec.get("q_tokens", 1), spec.get("gqa", 8))
    return rule and spec.get("split", True)


def compile_group(spec: dict) -> tuple:
    """What (roughly) selects a distinct Triton compilation of the kernels for
    a call of this shape: split-K or 2D, window or not, cache dtype, kv heads
    and query heads per kv head (num_query_heads is a constexpr), head size,
    sinks or not, and the batch size's integer specialization (1, a multiple
    of 16, other). Query tokens per request only choose the path."""
    b, kvh, g = spec["batch"], spec["kv_heads"], spec.get("gqa", 8)
    return (spec_split(spec), bool(spec["window"]), spec["kv_dtype"], kvh, g, spec.get("head_dim", HEAD_DIM),
            spec.get("sinks", True), b == 1, b % 16 == 0)


def partition(specs: list[dict], n: int) -> list[list[dict]]:
    """``specs`` in ``n`` lists, each compile group whole, groups dealt out in
    order of first appearance (the first rows' kernels first)."""
    groups: dict = {}
    for s in specs:
        groups.setdefault(compile_group(s), []).append(s)
    out = [[] for _ in range(max(1, n))]
    for i, g in enumerate(groups.values()):
        out[i % len(out)] += g
    return [o for o in out if o]


class _CompileOnly:
    """Stands in for a @triton.jit kernel: ``kernel[grid](...)`` compiles (and
    caches on disk) without launching anything."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.fn.run(*args, grid=grid, warmup=True, **kwargs)


def warm(specs: list[dict], log=print) -> int:
    """Compiles the kernels for calls shaped like ``specs`` into Triton's disk
    cache, in this process only (its kernels are swapped for compile-only
    stand-ins): the benchmark's worker then finds them built. Tensors live on
    the CPU (no GPU work; only the CUDA target is queried). Returns how many
    calls compiled."""
    import time

    import torch

    m = load()
    m.kernel_unified_attention = _CompileOnly(m.kernel_unified_attention)
    m.reduce_segments = _CompileOnly(m.reduce_segments)
    done = 0
    for s in specs:
        t0 = time.time()
        b, kvh, width = s["batch"], s["kv_heads"], s["width"]
        g, d, qt = s.get("gqa", 8), s.get("head_dim", HEAD_DIM), s.get("q_tokens", 1)
        dtype = torch.float8_e4m3fn if s["kv_dtype"] == "fp8" else torch.bfloat16
        q = torch.empty(*((b, g * kvh) if qt == 1 else (b, qt, g * kvh)), d, dtype=torch.bfloat16)
        kv = torch.empty(2, kvh, 16, 2 * d, dtype=dtype)
        scale1 = torch.empty(1, dtype=torch.float32)
        sinks = torch.empty(g * kvh) if s.get("sinks", True) else None
        kw = decode_kwargs(m, q, kv, torch.empty(b, width, dtype=torch.int32), torch.empty(b, dtype=torch.int32),
                           sinks, s["window"], d**-0.5, torch.empty_like(q),
                           make_scratch(g * kvh, kvh, "cpu", d, qt) if s.get("split", True) else NO_SPLIT,
                           16 * width, scale1, scale1)
        try:
            m.unified_attention(**kw)
            done += 1
            if time.time() - t0 > 0.2:  # compiled (not found in the cache)
                log(f"[triton-warm] compiled {s} in {time.time() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001 (the worker compiles it itself then)
            log(f"[triton-warm] {s}: failed: {type(e).__name__}: {str(e)[:300]}")
    return done


def compile_check(specs: list[dict], log=print) -> int:
    """warm() on a machine without a GPU: Triton's driver is replaced by one
    that names an sm_90 target (no device is touched), so the kernels compile
    to cubins for Hopper with the installed triton and ptxas."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class _Hopper:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    driver.set_active(_Hopper())  # for this process's life (a check's own process)
    return warm(specs, log)


# --- checking the mapping on the CPU ------------------------------------------------------


def enable_cpu_interpreter() -> None:
    """Lets Triton's CPU interpreter (TRITON_INTERPRET=1, set before load())
    run the peer: two fixes to triton 3.6's interpreter, not to the peer --
    ``__index__`` of a one-element array (numpy 2 refuses int() of it) and
    tl.dot of bf16 operands (stored as uint16 there, so upcast to fp32 first)."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    if getattr(interp, "_flint_patched", False):
        return
    patch_tensor = interp._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    create_dot = interp.InterpreterBuilder.create_dot

    def _f32(h):
        if h.dtype != tl.bfloat16:
            return h
        data = interp._convert_float(h.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interp.TensorHandle(data, tl.float32)

    def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, _f32(a), _f32(b), d, input_precision, max_num_imprecise_acc)

    interp._patch_lang_tensor = _patch_lang_tensor
    interp.InterpreterBuilder.create_dot = _create_dot
    interp._flint_patched = True


def cpu_check(peer_dir: Path | None = None) -> list[str]:
    """Runs the peer through decode_kwargs on small CPU batches (Triton's
    interpreter: the process must have TRITON_INTERPRET=1 before load()) and
    compares with the float64 reference: bf16 and fp8 caches (distinct k and
    v scales), no window and a window, the split-K and the 2D kernel, a padding
    row, unattended cache slots poisoned with NaN/Inf, and 2, 4 and 8 query
    tokens per request (q [B, Q, H, D]). Raises on a mismatch."""
    import os

    import torch

    from benchmarks.peers.checks import K_SCALE, PEER_TOL, V_SCALE
    from flint_attention.testing import FP8, error_report, make_paged_inputs, reference_decode_attention

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("set TRITON_INTERPRET=1 before running the CPU check")
    enable_cpu_interpreter()
    m = load(peer_dir)
    lines = []
    # (G, D, sinks, Q, [(kv dtype, window, split-K)]): every combination at the
    # core rows' shape with one and with 4 query tokens, two at each of the
    # models' shapes and at 2 and 8 query tokens.
    every = [(d, w, sp) for d in (torch.bfloat16, FP8) for w in (None, 20) for sp in (True, False)]
    two = [(torch.bfloat16, None, True), (FP8, 20, False)]
    shapes = [(8, HEAD_DIM, True, 1, every), (8, 64, True, 1, two), (4, 128, False, 1, two),
              (6, 128, False, 1, two), (12, 128, False, 1, two), (16, 128, False, 1, two),
              (8, 256, False, 1, two), (8, HEAD_DIM, True, 4, every),
              (8, HEAD_DIM, True, 2, [(torch.bfloat16, 20, True), (FP8, None, False)]),
              (8, HEAD_DIM, True, 8, [(torch.bfloat16, None, True), (FP8, 20, True)])]
    for group, d, sinks, q_tokens, combos in shapes:
        # With Q > 1 every real request holds at least Q tokens (a verify step's).
        lens = [40, 0, 70, 3] if q_tokens == 1 else [40, 0, 70, 9]
        for kv_dtype, window, split in combos:
            kw = dict(k_scale=K_SCALE, v_scale=V_SCALE) if kv_dtype == FP8 else {}
            inp = make_paged_inputs(len(lens), lens, 2, window, "cpu", seed=5, kv_dtype=kv_dtype, group=group,
                                    head_dim=d, with_sinks=sinks, q_tokens=q_tokens if q_tokens > 1 else None,
                                    **kw)
            ref = reference_decode_attention(inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks,
                                             window, d**-0.5, inp.k_scale, inp.v_scale)
            if split:  # the split-K kernel, as the benchmark's calls of this shape take it
                assert uses_split_kernel(len(lens), 2, q_tokens, group), (group, q_tokens)
            scratch = make_scratch(group * 2, 2, "cpu", d, q_tokens) if split else NO_SPLIT
            out = torch.full_like(inp.out, float("nan"))
            m.unified_attention(**decode_kwargs(
                m, inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, window,
                d**-0.5, out, scratch, max(lens), inp.k_scale, inp.v_scale))
            real = [i for i, n in enumerate(lens) if n > 0]
            dt = "fp8" if kv_dtype == FP8 else "bf16"
            tol = PEER_TOL[dt]
            rep = error_report(out[real], ref[real], tol)
            what = (f"G{group} D{d}{'' if sinks else ' no sinks'}{f' Q{q_tokens}' if q_tokens > 1 else ''} "
                    f"{dt} window {window} {'split-K' if split else '2D'}")
            if not rep.ok(tol):
                raise AssertionError(f"{what}: {rep.describe(tol)}")
            lines.append(f"{what}: ok (rel err {rep.rel_fro:.1e})")
    return lines

if __name__ == "__main__":
    usage = ("usage: TRITON_INTERPRET=1 python benchmarks/peers/peer_vllm.py --cpu-check\n"
             "       python benchmarks/peers/peer_vllm.py --warm SPECS.json            (GPU machine)\n"
             "       python benchmarks/peers/peer_vllm.py --compile-check SPECS.json   (no GPU needed)")
    from benchmarks import checkout

    checkout.use_this_checkout()
    if sys.argv[1:] == ["--cpu-check"]:
        for line in cpu_check():
            print(line, flush=True)
    elif len(sys.argv) == 3 and sys.argv[1] in ("--warm", "--compile-check"):
        todo = json.loads(Path(sys.argv[2]).read_text())
        fn = warm if sys.argv[1] == "--warm" else compile_check
        n = fn(todo, lambda msg: print(msg, file=sys.stderr, flush=True))
        print(f"[triton-warm] {n} of {len(todo)} compiled", file=sys.stderr, flush=True)
        sys.exit(0 if n == len(todo) else 1)
    else:
        sys.exit(usage)
