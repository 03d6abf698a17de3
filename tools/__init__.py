"""Profiling, A/B and verification tools for kernel work (tools/README.md).

A package so that the tools import one another (and the benchmark's modules)
as ``tools.<module>`` / ``benchmarks.<module>`` from the repository root; run
as files they put the repository root on ``sys.path`` themselves. Tools may
use the benchmark; the benchmark never uses a tool.
"""
