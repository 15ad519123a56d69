"""A model table's engines on shared CPUs against split ones: the measurement `model_cpus=auto` rests on
(service/policy/machine/table_cpus.py).

  .venv/bin/python -m bench.tools.table_cpus [--size 1.5b] [--repetitions 3] [--rounds 3] [--max-tokens 48]
  .venv/bin/python -m bench.tools.promote bench/results/<stamp>-table-cpus [--cpu xeon-amx]

Two tables run side by side, each serving the bench model's Q4_0 file twice (as `a` and `b`, both pinned, two engines
at once): one with `model_cpus=shared`, one with `model_cpus=split`. Each round, in alternating order of the tables:
one engine decodes alone beside its idle twin (`alone`, a and b in turn), then both decode a stream at once
(`together`, tok/s summed). A round's ratios are split / shared; a repetition (a restart of both tables) is the
unit, its rounds averaged as logs; the intervals are over repetitions. Only one table computes at a time: an idle
engine does not spin (bench/paired.py).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.context import cache_dir
from bench.paired import decode_rate
from bench.servers import Reported, bench_env
from bench.stats import estimate
from harness import REPO, ServerProcess
from harness.models import SIZES

MODES = ("split", "shared")
NAMES = ("a", "b")
FORMAT = "q4_0-gguf"


def _table(model: Path, mode: str, directory: Path) -> Path:
    config = {
        "models": [
            {"source": str(model), "name": n, "pinned": True, "kv_cache_gib": 0.5, "max_model_len": 4096} for n in NAMES
        ],
        "max_loaded_models": len(NAMES),
        "model_cpus": mode,
        "warmup": True,
    }
    path = directory / f"table-{mode}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _together(url: str, max_tokens: int, short: int = 8) -> float:
    """Both engines' decode tok/s summed: their streams of `max_tokens` started at once, then of `short` (the prefill
    and request overheads cancel, as in decode_rate)."""

    def both(n: int) -> float:
        body = {"prompt": "The quick brown fox", "temperature": 0, "ignore_eos": True, "max_tokens": n}
        start = time.perf_counter()
        with ThreadPoolExecutor(len(NAMES)) as pool:
            answers = list(
                pool.map(lambda m: httpx.post(f"{url}/v1/completions", json=body | {"model": m}, timeout=600), NAMES)
            )
        for answer in answers:
            answer.raise_for_status()
            assert answer.json()["usage"]["completion_tokens"] == n, answer.json()["usage"]
        return time.perf_counter() - start

    return len(NAMES) * (max_tokens - short) / (both(max_tokens) - both(short))


def _geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def measure(model: Path, out: Path, repetitions: int, rounds: int, max_tokens: int) -> dict[str, Any]:
    env = bench_env() | {"SERVICE_CACHE_DIR": str(cache_dir())}
    samples: dict[str, list[float]] = {"alone": [], "together": []}
    runs, machine, plans = [], None, {}
    for rep in range(repetitions):
        servers: dict[str, ServerProcess] = {}
        try:
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                config = {"SERVICE_CONFIG": str(_table(model, mode, out))}
                servers[mode] = ServerProcess(env | config, out / f"server-{mode}-{rep}.log", name=mode).start()
                servers[mode].wait_ready(1200)
            for mode, server in servers.items():
                hardware = httpx.get(f"{server.url}/v1/hardware", timeout=30).json()
                plans[mode] = hardware["cpus"]
                machine = machine or Reported(hardware["models"][0]["plan"]).machine()
                for name in NAMES:
                    decode_rate(server.url, name, 16)  # first requests after start: not timed
            tok_s: dict[str, dict[str, list[float]]] = {m: {"alone": [], "together": []} for m in MODES}
            for i in range(rounds):
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    url = servers[mode].url
                    tok_s[mode]["alone"].append(decode_rate(url, NAMES[i % 2], max_tokens))
                    tok_s[mode]["together"].append(_together(url, max_tokens))
        finally:
            for server in servers.values():
                server.close()
        for what in samples:
            pairs = [s / h for s, h in zip(tok_s["split"][what], tok_s["shared"][what], strict=True)]
            samples[what].append(_geomean(pairs))
            print(f"rep {rep} {what}: split/shared per round " + " ".join(f"{p:.3f}" for p in pairs), file=sys.stderr)
        runs.append({"repetition": rep, "tok_s": tok_s})
        print(f"rep {rep}: {json.dumps(tok_s)}", file=sys.stderr)
    return {
        "samples": samples,
        "estimates": {what: _as_dict(estimate(what, "ratio", xs)) for what, xs in samples.items()},
        "runs": runs,
        "plans": plans,
        "machine": machine,
    }


def _as_dict(e: Any) -> dict[str, Any]:
    return {"value": e.value, "low": e.low, "high": e.high, "n": e.n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="1.5b", help="the bench model's shape")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    model = cache_dir() / "models" / f"bench-llama-{args.size}-v2.q4_0.gguf"
    if not model.exists():
        raise SystemExit(f"{model} is missing: `make bench-peer` with --peer-size {args.size} makes it")
    started = datetime.now()
    out = REPO / "bench" / "results" / f"{started:%Y%m%d-%H%M%S}-table-cpus"
    out.mkdir(parents=True)
    results = measure(model, out, args.repetitions, args.rounds, args.max_tokens)
    results |= {
        "table_cpus": {"size": args.size, "format": FORMAT, "max_tokens": args.max_tokens, "rounds": args.rounds},
        "command": "python -m bench.tools.table_cpus " + " ".join(sys.argv[1:]),
        "started": started.isoformat(timespec="minutes"),
        "seconds": round(time.time() - started.timestamp()),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    for what, e in results["estimates"].items():
        low, high = (f"{x:.3f}" if x is not None else "-" for x in (e["low"], e["high"]))
        print(f"{what}: split / shared x{e['value']:.3f} [{low}, {high}] over {e['n']} repetition(s)")
    print(f"results in {out}")


if __name__ == "__main__":
    main()
