"""Two variants of the service served side by side, compared by batch-1 decode rate in adjacent pairs.

Each repetition starts both variants, in alternating order, and keeps both running; then `requests` pairs of decode
rates (decode_rate: a long and a short greedy request, ignore_eos, one after the other), one per variant, back to
back, order alternating. Pairs, not separate starts: on a shared VM the host's memory bandwidth, which a batch-1
decode follows, moved by x1.7 within minutes (Zen 5 guest, 2026-11-23), so rates measured minutes apart were not
comparable (with/without preload x0.918 [0.437, 1.927] over three restarts measured one variant at a time).
The repetition (a restart of both) is the unit: its pairs' ratios are averaged as logs into one sample.
bench/parts/preload.py (with/without the preload) and bench/parts/dtype.py (bf16/fp32) are its two uses.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness import REPO, ServerProcess, offline_env


def _rate(url: str, body: Callable[[int], dict[str, Any]], counted: str, long: int, short: int) -> float:
    """Tokens per second from two requests that differ only in `n` tokens: (long - short) / (time of the long one -
    time of the short one), each checked to have `counted` (a usage field) equal to its n."""

    def timed(n: int) -> float:
        start = time.perf_counter()
        resp = httpx.post(f"{url}/v1/completions", json=body(n), timeout=600)
        resp.raise_for_status()
        assert resp.json()["usage"][counted] == n, resp.json()["usage"]
        return time.perf_counter() - start

    return (long - short) / (timed(long) - timed(short))


def decode_rate(
    url: str, model: str, max_tokens: int, short: int = 8, sampling: Mapping[str, Any] | None = None
) -> float:
    """Decode tok/s at batch 1 from two requests of the same prompt that differ only in length (ignore_eos: exactly
    that many tokens), greedy unless `sampling` (request fields) says otherwise. Prefill and request overheads
    cancel; a random-weight model's text may be held back mid-character, token counts are not."""
    prompt = {"model": model, "prompt": "The quick brown fox", "temperature": 0, "ignore_eos": True, **(sampling or {})}
    return _rate(url, lambda n: prompt | {"max_tokens": n}, "completion_tokens", max_tokens, short)


def prefill_rate(url: str, model: str, tokens: int = 40, short: int = 8) -> float:
    """Prefill tok/s from two one-token requests whose prompts (token ids) differ only in length."""
    body = {"model": model, "max_tokens": 1, "temperature": 0}
    return _rate(url, lambda n: body | {"prompt": list(range(100, 100 + n))}, "prompt_tokens", tokens, short)


@dataclass(frozen=True)
class Run:
    """One paired measurement: the model, where its servers cache and log, how many restarts and rates."""

    model: Path
    cache_dir: Path
    log_dir: Path
    repetitions: int = 3
    requests: int = 4
    max_tokens: int = 128
    settings: Mapping[str, str] = field(default_factory=dict)  # SERVICE_* settings of both variants
    sampling: Mapping[str, Any] = field(default_factory=dict)  # the decode requests' sampling fields (default greedy)
    ready_timeout: float = 900


def measure(variants: Mapping[str, Mapping[str, str]], run: Run, prefill: bool = False) -> dict[str, Any]:
    """Decode tok/s of two variants (name -> environment on top of the base one), running side by side, in adjacent
    pairs; per repetition the geometric mean of its pairs' ratios first/second ("ratios"). With `prefill`, each
    measurement also takes a prefill rate, paired the same way ("prefill_ratios")."""
    first, second = names = tuple(variants)
    model, log_dir, repetitions, requests, max_tokens = (
        run.model,
        run.log_dir,
        run.repetitions,
        run.requests,
        run.max_tokens,
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    base = offline_env(drop=("SERVICE_", "LD_PRELOAD"))
    base.update(
        SERVICE_MODEL=str(model),
        SERVICE_SERVED_MODEL_NAME="bench",
        SERVICE_CACHE_DIR=str(run.cache_dir),
        SERVICE_WARMUP="true",
    )
    base.update({f"SERVICE_{k.upper()}": v for k, v in run.settings.items()})
    runs_: list[dict[str, Any]] = []
    ratios, prefill_ratios = [], []
    for rep in range(repetitions):
        started: dict[str, ServerProcess] = {}
        ready_s: dict[str, float] = {}
        try:
            # Both variants up at once, started in alternating order; their engines share the compute CPUs but
            # only one decodes at a time (an idle engine does not spin).
            for variant in names if rep % 2 == 0 else names[::-1]:
                log_path = log_dir / f"server-{variant}-{rep}.log"
                started[variant] = ServerProcess(base | dict(variants[variant]), log_path, name=variant).start()
                ready_s[variant] = started[variant].wait_ready(run.ready_timeout)
            decisions = {}
            for variant, server in started.items():
                report = httpx.get(f"{server.url}/v1/hardware", timeout=30).json()
                decisions[variant] = {d["setting"]: d for d in report.get("decisions", [])}
                decode_rate(server.url, "bench", 16)  # first requests after start: not timed
            load_before = os.getloadavg()[0]
            tok_s: dict[str, list[float]] = {v: [] for v in names}
            prefill_tok_s: dict[str, list[float]] = {v: [] for v in names}
            for i in range(requests):
                # Adjacent in time and in alternating order: the host's memory bandwidth, which moves by tens of
                # percent within minutes on a shared VM, is nearly the same for both measurements of a pair.
                for variant in names if i % 2 == 0 else names[::-1]:
                    tok_s[variant].append(decode_rate(started[variant].url, "bench", max_tokens, sampling=run.sampling))
                    if prefill:
                        prefill_tok_s[variant].append(prefill_rate(started[variant].url, "bench"))
            load_after = os.getloadavg()[0]
        finally:
            for server in started.values():
                server.close()
        pairs = [a / b for a, b in zip(tok_s[first], tok_s[second])]
        ratios.append(_geomean(pairs))
        if prefill:
            prefill_ratios.append(_geomean([a / b for a, b in zip(prefill_tok_s[first], prefill_tok_s[second])]))
        for variant in names:
            runs_.append(
                {
                    "variant": variant,
                    "repetition": rep,
                    "tok_s": tok_s[variant],
                    "median": statistics.median(tok_s[variant]),
                    **({"prefill_tok_s": prefill_tok_s[variant]} if prefill else {}),
                    "decisions": decisions[variant],
                    "ready_s": ready_s[variant],  # from start to ready, while no other variant computed
                    "loadavg_1m": [load_before, load_after],
                }
            )
            print(
                f"rep {rep} {variant:8s}: " + " ".join(f"{t:.2f}" for t in tok_s[variant]) + " tok/s", file=sys.stderr
            )
        print(f"rep {rep} {first}/{second} per pair: " + " ".join(f"{r:.3f}" for r in pairs), file=sys.stderr)
    return {
        "model": str(model),
        "variants": list(names),
        "max_tokens": max_tokens,
        "requests_per_start": requests,
        "runs": runs_,
        "median_tok_s": {v: statistics.median([r["median"] for r in runs_ if r["variant"] == v]) for v in names},
        "ratios": ratios,
        "ratio_median": statistics.median(ratios),
        **({"prefill_ratios": prefill_ratios} if prefill else {}),
        "cpus": os.cpu_count(),
    }


def _geomean(ratios: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def print_summary(result: dict[str, Any]) -> None:
    first, second = result["variants"]
    for rep, ratio in enumerate(result["ratios"]):
        print(f"repetition {rep}: {first}/{second} = {ratio:.3f}")
    med = result["median_tok_s"]
    print(
        f"decode tok/s (median of starts): {first} {med[first]:.2f}, {second} {med[second]:.2f}; "
        f"ratio median {result['ratio_median']:.3f} (range {min(result['ratios']):.3f}-{max(result['ratios']):.3f})"
    )
    if "prefill_ratios" in result:
        print(f"prefill {first}/{second} per repetition: " + " ".join(f"{r:.3f}" for r in result["prefill_ratios"]))


def summary(result: dict[str, Any], what: str) -> str:
    """One line of a paired measurement: each variant's median decode rate, the ratio first/second with its
    interval, and the prefill ratio where it was measured."""
    first, second = result["variants"]
    med = result["median_tok_s"]
    prefill = f", prefill {result['prefill_estimate']}" if "prefill_estimate" in result else ""
    return (
        f"{what}: {first} {med[first]:.2f} tok/s, {second} {med[second]:.2f} tok/s: "
        f"{first}/{second} decode {result['estimate']}{prefill}"
    )


def bench_run(cache: Path, log_dir: Path, repetitions: int, max_tokens: int, settings: Mapping[str, str]) -> Run:
    """A paired run on the bench model (built on first use in `cache`), 4 rates per start, a KV cache of 1 GiB."""
    from harness.models import ensure_bench_model

    return Run(ensure_bench_model(cache), cache, log_dir, repetitions, 4, max_tokens, {"kv_cache_gib": "1", **settings})


def cli(
    measure: Callable[[Run], dict[str, Any]], doc: str, out_name: str, max_tokens: int, eager: bool
) -> dict[str, Any]:
    """`python -m bench.<name>`: the bench model (or --model), a paired measurement, its JSON under --out."""
    from harness.models import ensure_bench_model
    from service.settings import default_cache_dir

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="default: the bench model (built on first use)")
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=max_tokens)
    ap.add_argument("--eager", action=argparse.BooleanOptionalAction, default=eager, help="skip torch.compile")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / f"bench-{out_name}")
    args = ap.parse_args()
    run = Run(
        args.model or ensure_bench_model(args.cache_dir),
        args.cache_dir,
        args.out / "logs",
        args.repetitions,
        args.requests,
        args.max_tokens,
        {"kv_cache_gib": "1", "enforce_eager": "true" if args.eager else "false"},
    )
    result = measure(run)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{out_name}.json").write_text(json.dumps(result, indent=2))
    print_summary(result)
    return result
