"""Speculative decoding against none, side by side: the measurement `speculative=auto` rests on
(service/policy/speculative.py).

  .venv/bin/python -m bench.speculative [--repetitions 2] [--requests 3] [--max-tokens 128] [--concurrency 1 4]

The default model is served twice at once, with the n-gram proposer and without, and answers the same chat requests
in adjacent pairs, order alternating. Two workloads: text that repeats its context (a licence an installed package
ships, copied; a standard-library function, edited; a package's metadata as a JSON tool result, summarised) and free
generation (a story, an explanation). Per workload and concurrency: completion tokens per second of wall time,
ngram/off per pair, averaged as logs per repetition (a restart of both); and the n-gram proposer's acceptance from
the server's own `vllm:spec_decode_*` counters.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import math
import statistics
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.stats import estimate
from harness import REPO, ServerProcess, offline_env

VARIANTS = {"ngram": {"SERVICE_SPECULATIVE": "ngram"}, "off": {"SERVICE_SPECULATIVE": "off"}}
COUNTERS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")


def workloads() -> dict[str, list[str]]:
    """User messages per workload, from text installed packages ship (not text written for the bench)."""
    licence = importlib.metadata.distribution("httpx").read_text("licenses/LICENSE.md") or ""
    code = inspect.getsource(textwrap.TextWrapper._split)
    metadata = json.dumps({k: v for k, v in importlib.metadata.metadata("httpx").json.items() if k != "description"})
    return {
        "repeated": [
            f"Copy this licence text exactly, word for word:\n\n{licence}",
            f"Rewrite this Python method with its parameter `text` renamed to `source`, changing nothing else:\n\n"
            f"{code}",
            f"A tool returned this JSON. List every field with its value, one per line:\n\n{metadata}",
        ],
        "free": [
            "Write a short story about a lighthouse keeper who finds a message in a bottle.",
            "Explain how a refrigerator keeps food cold, step by step.",
            "Describe a walk through a forest in autumn.",
        ],
    }


def counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found


def throughput(url: str, messages: list[str], concurrency: int, max_tokens: int) -> float:
    """Completion tokens per second of wall time, `concurrency` requests at once, each message once per slot."""

    def one(content: str) -> int:
        body = {
            "model": "bench",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900)
        resp.raise_for_status()
        return int(resp.json()["usage"]["completion_tokens"])

    batch = [messages[i % len(messages)] for i in range(max(concurrency, len(messages)))]
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, batch))
    return tokens / (time.perf_counter() - start)


def measure(
    model: Path | None,
    cache_dir: Path,
    log_dir: Path,
    repetitions: int,
    requests: int,
    max_tokens: int,
    levels: list[int],
) -> dict[str, Any]:
    """`model` None: the default model as `make serve` serves it. Both servers run at once: a KV cache of 1 GiB each."""
    log_dir.mkdir(parents=True, exist_ok=True)
    base = offline_env(drop=("SERVICE_", "LD_PRELOAD"))
    base.update(SERVICE_SERVED_MODEL_NAME="bench", SERVICE_CACHE_DIR=str(cache_dir), SERVICE_KV_CACHE_GIB="1")
    if model is not None:
        base.update(SERVICE_MODEL=str(model))
    loads = workloads()
    keys = [f"{w}/c{c}" for w in loads for c in levels]
    ratios: dict[str, list[float]] = {k: [] for k in keys}
    rates: dict[str, dict[str, list[float]]] = {k: {v: [] for v in VARIANTS} for k in keys}
    accepted: dict[str, list[float]] = {w: [] for w in loads}
    for rep in range(repetitions):
        started: dict[str, ServerProcess] = {}
        try:
            for variant in list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]:
                log_path = log_dir / f"server-{variant}-{rep}.log"
                started[variant] = ServerProcess(base | VARIANTS[variant], log_path, name=variant).start()
                started[variant].wait_ready(900)
            for server in started.values():  # first requests after start: not timed
                throughput(server.url, ["Say hello."], 1, 8)
            for workload, messages in loads.items():
                before = counters(started["ngram"].url)
                for c in levels:
                    pairs = []
                    for i in range(requests):
                        got = {}
                        for variant in list(VARIANTS) if i % 2 == 0 else list(VARIANTS)[::-1]:
                            got[variant] = throughput(started[variant].url, messages, c, max_tokens)
                            rates[f"{workload}/c{c}"][variant].append(got[variant])
                        pairs.append(got["ngram"] / got["off"])
                    ratios[f"{workload}/c{c}"].append(math.exp(statistics.fmean(map(math.log, pairs))))
                    print(
                        f"rep {rep} {workload} c={c}: ngram/off " + " ".join(f"{p:.3f}" for p in pairs), file=sys.stderr
                    )
                after = counters(started["ngram"].url)
                drafted = after[COUNTERS[0]] - before[COUNTERS[0]]
                accepted[workload].append((after[COUNTERS[1]] - before[COUNTERS[1]]) / drafted if drafted else 0.0)
        finally:
            for server in started.values():
                server.close()
    from service.facts.hardware import read_hardware

    cpu = read_hardware().cpu
    return {
        "model": str(model) if model else "the default model (SmolLM2-135M-Instruct, as make serve serves it)",
        "cpu": f"{cpu.vendor} {cpu.model_name} ({cpu.microarchitecture})",
        "max_tokens": max_tokens,
        "requests_per_start": requests,
        "ratios": ratios,
        "estimates": {k: estimate(f"{k} ngram/off", "ratio", v).fmt() for k, v in ratios.items()},
        "interval": {k: _interval(v) for k, v in ratios.items()},
        "median_tok_s": {k: {v: statistics.median(r) for v, r in by.items()} for k, by in rates.items()},
        "acceptance": {w: statistics.fmean(a) for w, a in accepted.items()},
    }


def _interval(samples: list[float]) -> list[float]:
    e = estimate("", "ratio", samples)
    return [round(e.low if e.low is not None else e.value, 3), round(e.high if e.high is not None else e.value, 3)]


def main() -> None:
    from service.facts.model import packaged_default_model_path
    from service.settings import default_cache_dir

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="default: the packaged default model (SmolLM2-135M-Instruct)")
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "bench-speculative")
    args = ap.parse_args()
    assert args.model or packaged_default_model_path(), "no model: the default model's wheel is not installed"
    result = measure(
        args.model,
        args.cache_dir,
        args.out / "logs",
        args.repetitions,
        args.requests,
        args.max_tokens,
        args.concurrency,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculative.json").write_text(json.dumps(result, indent=2))
    for text in result["estimates"].values():
        print(f"{result['cpu']}: {text}")
    print("acceptance (accepted / drafted): " + ", ".join(f"{w} {a:.2f}" for w, a in result["acceptance"].items()))


if __name__ == "__main__":
    main()
