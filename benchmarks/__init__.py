"""The decode benchmark (benchmarks/README.md): rows, timing, peers, reports.

A package so that its modules import one another as ``benchmarks.<module>``
from the repository root (the tests, ``python -m benchmarks.bench_decode``);
run as files (``python benchmarks/bench_decode.py``) they put the repository
root on ``sys.path`` themselves. Dependencies go one way: bench_decode ->
bench_gpu -> peers, bench_grid -> bench_report.
"""
