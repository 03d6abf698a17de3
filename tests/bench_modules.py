"""Loads the benchmark's modules (benchmarks/*.py) by file path for the CPU
tests of its rows, reporting and GPU-free logic, without putting
benchmarks/ on sys.path: each is registered under its own name, so their
imports of one another resolve to these."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
# In dependency order.
ORDER = ("bench_report", "bench_grid", "peer_xqa", "peer_vllm", "bench_gpu", "bench_decode")


def load(name: str):
    for dep in ORDER[: ORDER.index(name) + 1]:
        if dep not in sys.modules:
            spec = importlib.util.spec_from_file_location(dep, BENCH / f"{dep}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[dep] = module
            spec.loader.exec_module(module)
    return sys.modules[name]
