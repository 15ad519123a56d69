"""Native batch-1 decode with and without the preload the service decides (service/policy/preload.py).

  .venv/bin/python -m bench.preload [--model PATH] [--repetitions 3] [--requests 4] [--max-tokens 128]

"with": the service's own decision (tcmalloc + the backend's OpenMP runtime). "without": what vLLM does on its
own when nothing is preloaded: it preloads torch's GNU OpenMP and no allocator (vllm/platforms/cpu.py); the
benchmark sets exactly that as the user's LD_PRELOAD, which the policy leaves alone. Each repetition starts
both variants, in alternating order, and keeps both running; then `requests` pairs of decode rates (decode_rate: a
long and a short greedy request, ignore_eos, one after the other), one per variant, back to back, order alternating.
Pairs, not separate starts: on a shared VM the host's memory bandwidth, which a batch-1 decode follows, moved by
x1.7 within minutes (Zen 5 guest, 2026-11-23), so rates measured minutes apart were not comparable (with/without
x0.918 [0.437, 1.927] over three restarts measured one variant at a time).
`measure()` is what the benchmark tool calls; main() prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("with", "without")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_gomp() -> str:
    """The runtime vLLM preloads itself when LD_PRELOAD names no OpenMP runtime."""
    from service.facts.libraries import read_libraries

    gomp = read_libraries().torch_gomp
    if gomp is None:
        raise RuntimeError("torch's libgomp not found: cannot reproduce vLLM's own default preload")
    return str(gomp)


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
    model: Path,
    cache_dir: Path,
    log_dir: Path,
    repetitions: int = 3,
    requests: int = 4,
    max_tokens: int = 128,
    settings: dict[str, str] | None = None,
    ready_timeout: float = 900,
) -> dict:
    """Decode tok/s of both variants, running side by side, in adjacent pairs; per repetition (a restart of both) the
    geometric mean of its pairs' ratios with/without."""
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
    extra = {"with": {}, "without": {"LD_PRELOAD": torch_gomp()}}
    runs: list[dict] = []
    ratios = []
    for rep in range(repetitions):
        started: dict[str, tuple[subprocess.Popen, str]] = {}
        try:
            # Both variants up at once, started in alternating order; their engines share the compute CPUs but
            # only one decodes at a time (an idle engine does not spin).
            for variant in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
                started[variant] = serve(base | extra[variant], log_dir / f"server-{variant}-{rep}.log", ready_timeout)
            preload = {}
            for variant, (_, url) in started.items():
                report = httpx.get(f"{url}/v1/hardware", timeout=30).json()
                preload[variant] = next(
                    (d for d in report.get("decisions", []) if d["setting"] == "env.LD_PRELOAD"), None
                )
                decode_rate(url, "bench", 16)  # first requests after start: not timed
            load_before = os.getloadavg()[0]
            tok_s: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for i in range(requests):
                # Adjacent in time and in alternating order: the host's memory bandwidth, which moves by tens of
                # percent within minutes on a shared VM, is nearly the same for both measurements of a pair.
                for variant in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
                    tok_s[variant].append(decode_rate(started[variant][1], "bench", max_tokens))
            load_after = os.getloadavg()[0]
        finally:
            for proc, _ in started.values():
                stop(proc)
        pairs = [w / wo for w, wo in zip(tok_s["with"], tok_s["without"])]
        ratios.append(math.exp(statistics.fmean(math.log(r) for r in pairs)))
        for variant in VARIANTS:
            runs.append(
                {
                    "variant": variant,
                    "repetition": rep,
                    "tok_s": tok_s[variant],
                    "median": statistics.median(tok_s[variant]),
                    "ld_preload": preload[variant],
                    "loadavg_1m": [load_before, load_after],
                }
            )
            print(
                f"rep {rep} {variant:7s}: " + " ".join(f"{t:.2f}" for t in tok_s[variant]) + " tok/s", file=sys.stderr
            )
        print(f"rep {rep} with/without per pair: " + " ".join(f"{r:.3f}" for r in pairs), file=sys.stderr)
    per_variant = {v: statistics.median([r["median"] for r in runs if r["variant"] == v]) for v in VARIANTS}
    return {
        "model": str(model),
        "max_tokens": max_tokens,
        "requests_per_start": requests,
        "runs": runs,
        "median_tok_s": per_variant,
        "ratio_with_over_without": ratios,
        "ratio_median": statistics.median(ratios),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    from bench.models import ensure_bench_model
    from service.settings import default_cache_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="default: the bench model (built on first use)")
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (skip torch.compile)")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "bench-preload")
    args = ap.parse_args()
    model = args.model or ensure_bench_model(args.cache_dir)
    settings = {"enforce_eager": "true" if args.eager else "false", "kv_cache_gib": "1"}
    result = measure(
        model, args.cache_dir, args.out / "logs", args.repetitions, args.requests, args.max_tokens, settings
    )
    (args.out / "preload.json").write_text(json.dumps(result, indent=2))
    for rep, ratio in enumerate(result["ratio_with_over_without"]):
        print(f"repetition {rep}: with/without = {ratio:.3f}")
    med = result["median_tok_s"]
    print(
        f"decode tok/s (median of starts): with {med['with']:.2f}, without {med['without']:.2f}; "
        f"ratio median {result['ratio_median']:.3f} (range {min(result['ratio_with_over_without']):.3f}-"
        f"{max(result['ratio_with_over_without']):.3f})"
    )


if __name__ == "__main__":
    main()
