"""The benchmark's peers (README.md here): FlashInfer's XQA (peer_xqa) and
vLLM's Triton unified attention (peer_vllm), and how their outputs are
checked (checks). They import nothing else of the benchmark: bench_gpu uses
them, never the other way round.
"""
