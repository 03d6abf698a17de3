"""The benchmark's peers (README.md here): FlashInfer's XQA (peer_xqa) and
vLLM's Triton unified attention (peer_vllm), and how their outputs are
checked (checks). Of the benchmark they import only checks and checkout:
bench_gpu uses them, never the other way round.
"""
