"""The load: vLLM's own benchmark client (`vllm.benchmarks.serve`, what `vllm bench serve` runs)."""
from __future__ import annotations

import asyncio
import contextlib
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.bench.stats import extract_metrics


@dataclass(frozen=True)
class Workload:
    """One random workload: fixed lengths (range ratio 0), ignore_eos, greedy, closed loop at `concurrency`."""

    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    seed: int

    def argv(self, base_url: str, model_path: str, served_name: str) -> list[str]:
        return [
            "--backend", "openai",
            "--base-url", base_url,
            "--endpoint", "/v1/completions",
            "--model", model_path,  # also the tokenizer the client builds prompts with
            "--served-model-name", served_name,
            "--dataset-name", "random",
            "--random-input-len", str(self.input_len),
            "--random-output-len", str(self.output_len),
            "--random-range-ratio", "0",
            "--num-prompts", str(self.num_prompts),
            "--max-concurrency", str(self.concurrency),
            "--request-rate", "inf",
            "--ignore-eos",
            "--temperature", "0",
            "--seed", str(self.seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99",
            "--num-warmups", "0",
            "--ready-check-timeout-sec", "0",
            "--disable-tqdm",
        ]


def client_args(argv: list[str]) -> Any:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(argv)


def run_load(workload: Workload, base_url: str, model_path: str, served_name: str, log: Path) -> dict[str, float]:
    """Run vllm.benchmarks.serve once; its printed report goes to `log`; returns the metrics we keep."""
    from vllm.benchmarks.serve import main_async

    args = client_args(workload.argv(base_url, model_path, served_name))
    with open(log, "a") as out, contextlib.redirect_stdout(out):
        print(f"===== {base_url} {workload}", flush=True)
        result = asyncio.run(main_async(args))
    gc.unfreeze()  # main_async freezes the heap for its run; let the next run start clean
    metrics = extract_metrics(result)
    if metrics["failed"] or metrics["completed"] != workload.num_prompts:
        errors = [e for e in result.get("errors", []) if e][:3]
        raise RuntimeError(f"{base_url}: {int(metrics['failed'])} request(s) failed: {errors}")
    return metrics
