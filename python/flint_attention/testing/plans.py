"""Launch plans, explicitly: what the op launches (``default_plan``), the
compiled variants, the split kernels' rules for A/B runs, and a call
with any of them (``run_with_plan``). Through the test-only extension
``flint_attention._testing`` (CUDA builds only); the operator itself never
takes a plan: it always launches ``default_plan``.

A plan is the C++ ``LaunchPlan`` (csrc/decode_attention/launch_plan.h).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

KINDS = ("balanced", "split", "cluster", "warp-per-head")
KV_DTYPES = ("bf16", "fp8")


@functools.cache
def _ops():
    import flint_attention  # noqa: F401  (the op library first: _testing links to it)
    import flint_attention._testing  # noqa: F401

    return torch.ops.flint_testing


@dataclasses.dataclass(frozen=True)
class Plan:
    kind: str = "balanced"
    kv: str = "bf16"
    warps: int = 8
    stages: int = 2
    splits: int = 0  # split / cluster kernels: CTAs per (request, kv head)
    min_pages: int = 1  # split kernels
    refill: int = 0  # Refill (params.h): 0 before the wait, 1 after, 2 after unless late (split), -1 the kernel's rule
    pdl: bool = True
    ctas: int = 0  # balanced kernel: the grid's CTAs (0: the launch's rule)

    @property
    def name(self) -> str:
        extra = f"x{self.splits}" if self.kind in ("split", "cluster") else ""
        return (f"{self.kind}{extra}:{self.kv}:w{self.warps}s{self.stages}" + ("" if self.pdl else ":nopdl")
                + (f":r{self.refill}" if self.kind == "balanced" and self.refill >= 0 else "")
                + (f":g{self.ctas}" if self.ctas else ""))

    def to_ints(self) -> list[int]:
        return [KINDS.index(self.kind), KV_DTYPES.index(self.kv), self.warps, self.stages,
                self.splits, self.min_pages, self.refill, int(self.pdl), self.ctas]

    @staticmethod
    def from_ints(v) -> Plan:
        return Plan(kind=KINDS[v[0]], kv=KV_DTYPES[v[1]], warps=int(v[2]), stages=int(v[3]),
                    splits=int(v[4]), min_pages=int(v[5]), refill=int(v[6]), pdl=bool(v[7]),
                    ctas=int(v[8]))

    def balance(self, seq_lens, window: int | None, num_kv_heads: int, max_blocks: int | None = None,
                device=None) -> tuple[int, float]:
        """(units of the busiest CTA, mean units per CTA of the launch's grid)
        of a call with these lengths under this plan, from the division the
        kernel makes on the device. Balanced plans: a unit is a page, or part
        of a piece's fixed cost (fp8: one unit per segment; bf16: none,
        csrc/decode_attention/division.h). Split, cluster and warp-per-head
        plans: a unit is a page, and a CTA's are what its warps stream (a
        split CTA that takes no request or no pages counts 0)."""
        lens = torch.as_tensor(list(seq_lens), dtype=torch.int32)
        device = torch.device(device or "cuda")
        longest = int(lens.max()) if lens.numel() else 0
        max_blocks = max_blocks or max(1, -(-longest // 16))
        q = torch.empty(len(lens), 8 * num_kv_heads, 128, dtype=torch.bfloat16, device=device)
        kv = torch.empty(1, num_kv_heads, 16, 256, dtype=torch.bfloat16, device=device)
        bt = torch.empty(len(lens), max_blocks, dtype=torch.int32, device=device)
        if self.kind != "balanced":
            per_cta = _ops().cta_pages(q, kv, bt, lens.to(device), window, self.to_ints())
            return max(per_cta), sum(per_cta) / len(per_cta)
        ctas, busiest, total = _ops().division(q, kv, bt, lens.to(device), window,
                                               self.to_ints())[:3]
        return busiest, total / ctas

    def cta_pages(self, q, kv_cache, block_tables, seq_lens, window: int | None) -> list[int]:
        """The attended pages each CTA of this (split, cluster or
        warp-per-head) plan's launch streams for this call, in the grid's
        order (x fastest), as the kernel divides them on the device."""
        return list(_ops().cta_pages(q, kv_cache, block_tables, seq_lens, window, self.to_ints()))


def default_plan(q: torch.Tensor, kv_cache: torch.Tensor, window: int | None) -> Plan:
    """What the op launches for such a call."""
    return Plan.from_ints(_ops().default_plan(q, kv_cache, window))


def split_rules_plan(q: torch.Tensor, kv_cache: torch.Tensor, window: int | None) -> Plan:
    """The split kernels' plan for such a call (either cache format): what
    the op launches for sliding windows and full attention below 8 requests
    or over at most 8 (request, kv head) pairs, for A/B runs against the
    balanced kernel on any shape."""
    return Plan.from_ints(_ops().split_rules_plan(q, kv_cache, window))


def plan_for_shape(batch: int, num_kv_heads: int, window: int | None, kv: str, sms: int,
                   split_rules: bool = False) -> Plan:
    """The op's plan (or with ``split_rules`` the split kernels') for a call of this
    shape on a GPU of ``sms`` SMs, computed on the host: no tensor, no GPU."""
    return Plan.from_ints(_ops().plan_for_shape(batch, num_kv_heads, window or 0,
                                                KV_DTYPES.index(kv), sms, split_rules))


def balanced_plan(kv_cache: torch.Tensor) -> Plan:
    """The balanced kernel's plan for a cache of this dtype, whatever the
    shape (what the op launches for full attention from 8 requests and more
    than 8 (request, kv head) pairs on), for A/B runs."""
    kv = "fp8" if kv_cache.dtype == torch.float8_e4m3fn else "bf16"
    return next(p for p in variants() if p.kind == "balanced" and p.kv == kv)


def variants() -> list[Plan]:
    """Every compiled kernel variant, as a plan (split plans with 4 splits)."""
    ops = _ops()
    return [Plan.from_ints(ops.variant(i)) for i in range(ops.num_variants())]


def run_with_plan(plan: Plan, q, kv_cache, block_tables, seq_lens, sinks, window, scale, out,
                  k_scale=None, v_scale=None, lse=None) -> torch.Tensor:
    """The op's CUDA path launched with `plan` instead of the default."""
    _ops().decode_attention_with_plan(q, kv_cache, block_tables, seq_lens, sinks, window, scale,
                                      out, k_scale, v_scale, lse, plan.to_ints())
    return out
