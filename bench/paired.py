"""Two variants of the service served side by side, compared by batch-1 decode rate in adjacent pairs.

Each repetition starts both variants, in alternating order, and keeps both running; then `requests` pairs of decode
rates (decode_rate: a long and a short greedy request, ignore_eos, one after the other), one per variant, back to
back, order alternating. Pairs, not separate starts: on a shared VM the host's memory bandwidth, which a batch-1
decode follows, moved by x1.7 within minutes (Zen 5 guest, 2026-11-23), so rates measured minutes apart were not
comparable (with/without preload x0.918 [0.437, 1.927] over three restarts measured one variant at a time).
The repetition (a restart of both) is the unit: its pairs' ratios are averaged as logs into one sample.
bench/preload.py (with/without the preload) and bench/dtype.py (bf16/fp32) are its two uses.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decode_rate(url: str, model: str, max_tokens: int, short: int = 8) -> float:
    """Decode tok/s at batch 1 from two greedy requests of the same prompt that differ only in length (ignore_eos:
    exactly that many tokens): (max_tokens - short) / (time of the long one - time of the short one). Prefill and
    request overheads cancel; a random-weight model's text may be held back mid-character, token counts are not."""

    def timed(n: int) -> float:
        body = {"model": model, "prompt": "The quick brown fox", "max_tokens": n, "temperature": 0, "ignore_eos": True}
        start = time.perf_counter()
        resp = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        resp.raise_for_status()
        assert resp.json()["usage"]["completion_tokens"] == n, resp.json()["usage"]
        return time.perf_counter() - start

    return (max_tokens - short) / (timed(max_tokens) - timed(short))


def prefill_rate(url: str, model: str, tokens: int = 40, short: int = 8) -> float:
    """Prefill tok/s from two one-token requests whose prompts (token ids) differ only in length:
    (tokens - short) / (time of the long one - time of the short one)."""

    def timed(n: int) -> float:
        body = {"model": model, "prompt": list(range(100, 100 + n)), "max_tokens": 1, "temperature": 0}
        start = time.perf_counter()
        resp = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        resp.raise_for_status()
        assert resp.json()["usage"]["prompt_tokens"] == n, resp.json()["usage"]
        return time.perf_counter() - start

    return (tokens - short) / (timed(tokens) - timed(short))


def serve(env: dict[str, str], log_path: Path, timeout: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(env, SERVICE_PORT=str(port), SERVICE_HOST="127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve"],
        cwd=REPO,
        env=env,
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
        process_group=0,  # the client's session: see harness.server.ServerProcess.start
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(proc)
    raise TimeoutError(f"server not ready after {timeout} s; see {log_path}")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the engine core and workers share the server's group
    except ProcessLookupError:
        pass
    proc.wait(10)


def measure(
    variants: Mapping[str, Mapping[str, str]],
    model: Path,
    cache_dir: Path,
    log_dir: Path,
    repetitions: int = 3,
    requests: int = 4,
    max_tokens: int = 128,
    settings: dict[str, str] | None = None,
    ready_timeout: float = 900,
    prefill: bool = False,
) -> dict:
    """Decode tok/s of two variants (name -> environment on top of the base one), running side by side, in adjacent
    pairs; per repetition the geometric mean of its pairs' ratios first/second ("ratios"). With `prefill`, each
    measurement also takes a prefill rate, paired the same way ("prefill_ratios")."""
    first, second = names = tuple(variants)
    log_dir.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_") and k != "LD_PRELOAD"}
    base.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        SERVICE_MODEL=str(model),
        SERVICE_SERVED_MODEL_NAME="bench",
        SERVICE_CACHE_DIR=str(cache_dir),
        SERVICE_WARMUP="true",
    )
    base.update({f"SERVICE_{k.upper()}": v for k, v in (settings or {}).items()})
    runs: list[dict] = []
    ratios, prefill_ratios = [], []
    for rep in range(repetitions):
        started: dict[str, tuple[subprocess.Popen, str]] = {}
        try:
            # Both variants up at once, started in alternating order; their engines share the compute CPUs but
            # only one decodes at a time (an idle engine does not spin).
            for variant in names if rep % 2 == 0 else names[::-1]:
                log_path = log_dir / f"server-{variant}-{rep}.log"
                started[variant] = serve(base | dict(variants[variant]), log_path, ready_timeout)
            decisions = {}
            for variant, (_, url) in started.items():
                report = httpx.get(f"{url}/v1/hardware", timeout=30).json()
                decisions[variant] = {d["setting"]: d for d in report.get("decisions", [])}
                decode_rate(url, "bench", 16)  # first requests after start: not timed
            load_before = os.getloadavg()[0]
            tok_s: dict[str, list[float]] = {v: [] for v in names}
            prefill_tok_s: dict[str, list[float]] = {v: [] for v in names}
            for i in range(requests):
                # Adjacent in time and in alternating order: the host's memory bandwidth, which moves by tens of
                # percent within minutes on a shared VM, is nearly the same for both measurements of a pair.
                for variant in names if i % 2 == 0 else names[::-1]:
                    tok_s[variant].append(decode_rate(started[variant][1], "bench", max_tokens))
                    if prefill:
                        prefill_tok_s[variant].append(prefill_rate(started[variant][1], "bench"))
            load_after = os.getloadavg()[0]
        finally:
            for proc, _ in started.values():
                stop(proc)
        pairs = [a / b for a, b in zip(tok_s[first], tok_s[second])]
        ratios.append(_geomean(pairs))
        if prefill:
            prefill_ratios.append(_geomean([a / b for a, b in zip(prefill_tok_s[first], prefill_tok_s[second])]))
        for variant in names:
            runs.append(
                {
                    "variant": variant,
                    "repetition": rep,
                    "tok_s": tok_s[variant],
                    "median": statistics.median(tok_s[variant]),
                    **({"prefill_tok_s": prefill_tok_s[variant]} if prefill else {}),
                    "decisions": decisions[variant],
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
        "runs": runs,
        "median_tok_s": {v: statistics.median([r["median"] for r in runs if r["variant"] == v]) for v in names},
        "ratios": ratios,
        "ratio_median": statistics.median(ratios),
        **({"prefill_ratios": prefill_ratios} if prefill else {}),
        "cpus": os.cpu_count(),
    }


def _geomean(ratios: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def print_summary(result: dict) -> None:
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
