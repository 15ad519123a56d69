"""vLLM's processes forked (the engine core from the API process, each worker from its engine core) against spawned
ones (service/in_vllm/worker_start.py): the measurement `worker_start=fork` rests on
(service/policy/in_vllm/worker_start.py).

  .venv/bin/python -m bench.tools.worker_start [--repetitions 3] [--requests 4]

The default model twice side by side (bench/paired.py), with `SERVICE_WORKER_START=spawn` and with the policy's
choice: each start's time to ready (the two starts of a repetition one after the other, alternating order, neither
computing while the other starts), and batch-1 decode rates in adjacent pairs, since a forked worker must decode as
fast as a spawned one (its threads bound the same way, its engine core on the same CPUs). Ratios fork/spawn with their 95% intervals.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.stats import estimate
from harness import REPO


def measure(repetitions: int, requests: int, out: Path) -> dict[str, Any]:
    from bench import paired
    from service.facts.model import packaged_default_model_path
    from service.settings import default_cache_dir

    model = packaged_default_model_path()
    assert model, "no model: the default model's wheel is not installed"
    run = paired.Run(model, default_cache_dir(), out / "logs", repetitions, requests, 128, {"kv_cache_gib": "1"})
    result = paired.measure({"fork": {}, "spawn": {"SERVICE_WORKER_START": "spawn"}}, run)
    for r in result["runs"]:
        decided = r["decisions"].get("env.SERVICE_WORKER_START_METHOD", {}).get("value")
        assert decided == r["variant"], f"{r['variant']} ran with worker_start {decided}"
    ready = {v: [r["ready_s"] for r in result["runs"] if r["variant"] == v] for v in result["variants"]}
    start = estimate("time to ready fork/spawn", "ratio", [f / s for f, s in zip(ready["fork"], ready["spawn"])])
    decode = estimate("decode fork/spawn", "ratio", result["ratios"])
    print(f"time to ready: fork {ready['fork']} s, spawn {ready['spawn']} s; fork/spawn {start.fmt()}")
    print(f"served decode: {paired.summary(result | {'estimate': decode.fmt()}, 'decode')}")
    return result | {
        "ready_s": ready,
        "start_estimate": start.fmt(),
        "start_interval": [start.value, start.low, start.high],
        "estimate": decode.fmt(),
        "interval": [decode.value, decode.low, decode.high],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "bench-worker-start")
    args = ap.parse_args()
    result = measure(args.repetitions, args.requests, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "worker_start.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
