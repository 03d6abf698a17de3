"""The Python face of ``torch.ops.flint.decode_attention``: the typed wrapper and
the fake (meta) implementation used by FakeTensor and ``torch.compile``."""

from __future__ import annotations

import torch

from flint_attention import _C  # noqa: F401  (loads the library, registers the op)

HEAD_DIM = 128
GQA = 8
PAGE_TOKENS = 16


def flint_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: torch.Tensor,
    window: int | None,
    scale: float,
    out: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged decode attention with sinks, one query token per request.

    For each request b and query head h (kv head h // 8), with L = seq_lens[b]
    and the attended positions P = [max(L - window, 0), L) (all of [0, L) when
    window is None), position p living in cache block block_tables[b, p // 16]
    at row p % 16:

        s_p = scale * q[b, h] . K[p]
        out[b, h] = sum_p exp(s_p) V[p] / (sum_p exp(s_p) + exp(sinks[h]))

    computed as the CUDA kernel does it: bf16 inputs, fp32 accumulation, P
    rounded to bf16 for P V. ``seq_lens[b] == 0`` writes zeros.

    CUDA-graph safe: the launch shape depends only on the batch size and the
    number of kv heads; sequence lengths and block tables are read on the device.

    Args:
        q: [B, num_heads, 128] bf16 queries, num_heads = 8 * num_kv_heads; the
            last dim contiguous, rows 16-byte aligned.
        kv_cache: [num_blocks, num_kv_heads, 16, 256] HND cache with K in
            ``[..., :128]`` and V in ``[..., 128:]``, bf16 or fp8
            (``torch.float8_e4m3fn``, storing x / scale); each (block, kv head)
            page contiguous and 16-byte aligned (a strided view of a larger
            allocation is fine).
        block_tables: [B, max_blocks] int32 block ids, rows contiguous.
        seq_lens: [B] int32 KV lengths including the current token (0 writes
            zeros). On the GPU, ``0 <= seq_lens[b] <= 16 * max_blocks`` and the
            block ids used are a contract, not checked (checking would need a
            sync); the CPU path checks them and raises. With programmatic
            dependent launch the kernel reads seq_lens, block_tables and sinks
            before the previous kernel on the stream has finished: that kernel
            must not write them (see the README; ``FLINT_PDL=0`` turns it off).
        sinks: [num_heads] fp32 sink logits.
        window: attend to the last ``window`` positions (>= 1), or None for all.
        scale: softmax scale, finite and > 0 (usually 128 ** -0.5).
        out: [B, num_heads, 128] bf16 output, written in place.
        k_scale, v_scale: with an fp8 cache only (and then both required):
            fp32 tensors of shape [1] (per tensor) or [num_kv_heads] on the
            cache's device, read on the device (a captured CUDA graph follows
            in-place changes); dequantized K = stored x k_scale, likewise V.
            Finite and > 0 (the CPU path checks; the GPU takes them on trust).

    Returns:
        ``out``.
    """
    torch.ops.flint.decode_attention(
        q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, k_scale, v_scale
    )
    return out


@torch.library.register_fake("flint::decode_attention")
def _decode_attention_fake(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                           k_scale=None, v_scale=None):
    # Metadata checks only (no data): the real kernels check everything.
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    expected = dict(q=torch.bfloat16, kv_cache=kv_cache.dtype if fp8 else torch.bfloat16,
                    block_tables=torch.int32, seq_lens=torch.int32, sinks=torch.float32,
                    out=torch.bfloat16)
    tensors = dict(q=q, kv_cache=kv_cache, block_tables=block_tables, seq_lens=seq_lens,
                   sinks=sinks, out=out)
    for name, t in tensors.items():
        torch._check(t.dtype == expected[name], lambda: f"{name} must be {expected[name]}, got {t.dtype}")
        torch._check(t.device == q.device, lambda: f"all tensors must be on one device; q is on {q.device} but {name} is on {t.device}")
    torch._check(q.dim() == 3 and q.shape[-1] == HEAD_DIM, lambda: f"q must be [B, H, 128], got {tuple(q.shape)}")
    torch._check(out.shape == q.shape, lambda: f"out must have the shape of q {tuple(q.shape)}, got {tuple(out.shape)}")
    torch._check(
        kv_cache.dim() == 4 and q.shape[1] == GQA * kv_cache.shape[1],
        lambda: f"num_heads must be 8 * num_kv_heads, got q {tuple(q.shape)}, kv_cache {tuple(kv_cache.shape)}",
    )
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        torch._check(fp8 == (s is not None), lambda: f"{name} goes with an fp8 kv_cache and only with one")
        if s is not None:
            torch._check(s.dtype == torch.float32 and s.dim() == 1 and s.shape[0] in (1, kv_cache.shape[1]),
                         lambda: f"{name} must be float32 of shape [1] or [num_kv_heads], got {s.dtype} {tuple(s.shape)}")
            torch._check(s.device == q.device, lambda: f"all tensors must be on one device; q is on {q.device} but {name} is on {s.device}")
    return None
