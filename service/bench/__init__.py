"""Benchmarks of issue 5 (`python -m service bench`): front-end overhead against vLLM's own server, policy
against vLLM's defaults, batch-1 decode against the memory-bandwidth ceiling. Load from vllm.benchmarks.serve."""
from service.bench.runner import BenchOptions, run_bench

__all__ = ["BenchOptions", "run_bench"]
