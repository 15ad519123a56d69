"""Native batch-1 decode with and without the preload the service decides (service/policy/preload.py).

  .venv/bin/python -m bench.preload [--model PATH] [--repetitions 3] [--requests 4] [--max-tokens 128]

"with": the service's own decision (tcmalloc + the backend's OpenMP runtime). "without": what vLLM does on its
own when nothing is preloaded: it preloads torch's GNU OpenMP and no allocator (vllm/platforms/cpu.py); the
benchmark sets exactly that as the user's LD_PRELOAD, which the policy leaves alone. Both run side by side and are
compared in adjacent pairs (bench/paired.py). `measure()` is what the benchmark tool calls; main() prints a table
and writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import paired
from bench.paired import REPO


def torch_gomp() -> str:
    """The runtime vLLM preloads itself when LD_PRELOAD names no OpenMP runtime."""
    from service.facts.libraries import read_libraries

    gomp = read_libraries().torch_gomp
    if gomp is None:
        raise RuntimeError("torch's libgomp not found: cannot reproduce vLLM's own default preload")
    return str(gomp)


def measure(
    model: Path,
    cache_dir: Path,
    log_dir: Path,
    repetitions: int = 3,
    requests: int = 4,
    max_tokens: int = 128,
    settings: dict[str, str] | None = None,
) -> dict:
    """with/without per repetition in "ratios"; each run carries the LD_PRELOAD decision its server reported."""
    variants = {"with": {}, "without": {"LD_PRELOAD": torch_gomp()}}
    return paired.measure(variants, model, cache_dir, log_dir, repetitions, requests, max_tokens, settings)


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
    paired.print_summary(result)


if __name__ == "__main__":
    main()
