"""Start-to-ready with torch.compile, cold (empty compile cache) then warm (the cache the cold start saved), and
each start's stop: SIGTERM to exit.

  .venv/bin/python -m bench.parts.warm_start [--model PATH | --default-model] [--out DIR]

A fresh cache_dir per measurement: the service decides VLLM_CACHE_ROOT under it, so the first start compiles
and saves, the second loads. Each start is read back from vLLM's own log lines: did it compile and save, load
the saved graph, or fail to load and compile again. `measure()` is what the benchmark tool calls.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.context import Context, cache_dir
from bench.output import Output, log
from bench.stats import Comparison, DecodeResult
from bench.tables import row
from harness import REPO, ServerProcess, offline_env

# vLLM 0.32's log lines (vllm/compilation/decorators.py, monitor.py, v1/engine/core.py).
SAVED = "saved AOT compiled function to"
LOADED = "Directly load AOT compilation from path"
RECOMPILED = "Compiling model again due to a load failure"
# vLLM's process manager SIGKILLs an engine core that has not ended 5 s after its SIGTERM (utils.py).
ENGINE_CORE_KILLED = "force killing remaining process"
INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")


# Only vLLM's own log lines count (they name their source file): the service's startup report quotes the
# recompile message in the reason of its compile-cache decision.
VLLM_LINE = re.compile(r"\[decorators\.py:\d+\] .*")


def read_log(text: str) -> dict[str, Any]:
    init = INIT_ENGINE.search(text)
    vllm = "\n".join(m[0] for m in VLLM_LINE.finditer(text))
    return {
        "compiled_and_saved": SAVED in vllm,
        "loaded_compiled": LOADED in vllm,
        "load_failed_recompiled": RECOMPILED in vllm,
        "engine_init_s": float(init[1]) if init else None,
        "engine_core_killed": ENGINE_CORE_KILLED in text,
    }


def measure(
    model: Path | None, work_dir: Path, settings: dict[str, str] | None = None, ready_timeout: float = 3600
) -> dict[str, Any]:
    """Cold then warm start of `model` (None: the service's default model, as `make serve` starts) with
    torch.compile."""
    cache_dir = work_dir / "cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    base = offline_env(drop=("SERVICE_", "VLLM_CACHE_ROOT"))
    base.update(SERVICE_CACHE_DIR=str(cache_dir), SERVICE_ENFORCE_EAGER="false")
    if model is not None:
        base["SERVICE_MODEL"] = str(model)
    base.update({f"SERVICE_{k.upper()}": v for k, v in (settings or {}).items()})
    result: dict[str, Any] = {"model": str(model) if model else "default", "loadavg_1m": os.getloadavg()[0]}
    for phase in ("cold", "warm"):
        log_path = work_dir / f"server-{phase}.log"
        start = time.monotonic()
        server = ServerProcess(base, log_path, name=phase).start()
        try:
            server.wait_ready(ready_timeout)
            ready = time.monotonic() - start
        finally:
            stopping = time.monotonic()
            server.close()
        stop = time.monotonic() - stopping
        result[phase] = {
            "ready_s": round(ready, 1),
            "stop_s": round(stop, 1),
            **read_log(log_path.read_text(errors="replace")),
        }
        print(f"{phase}: ready after {ready:.0f} s {result[phase]}", file=sys.stderr)
    return result


def run(ctx: Context, options: None) -> Output:
    """Start to /ready with torch.compile, cold (empty cache) then warm, for the default model (what `make serve`
    starts, its GGUF conversion included when cold) and the bench model."""
    from harness.models import ensure_bench_model

    out = []
    for name, model in (("default", None), ("bench", ensure_bench_model(cache_dir()))):
        log(f"start to ready, cold then warm compile cache: {name} model")
        result = measure(model, ctx.logdir / f"warm-start-{name}", {"kv_cache_gib": "1"})
        out.append(result | {"name": name})
        log(summary_line(out[-1]))
    return Output(out, summary=tuple(summary_line(w) for w in out))


def summary_line(result: dict[str, Any]) -> str:
    cold, warm = result["cold"], result["warm"]
    return (
        f"start to ready, {result['name']} model: cold {cold['ready_s']:.0f} s, warm {warm['ready_s']:.0f} s "
        f"(engine init {cold['engine_init_s']} s -> {warm['engine_init_s']} s; warm start "
        + ("loaded the compiled graph)" if warm["loaded_compiled"] and not warm["compiled_and_saved"] else "COMPILED)")
        + f"; SIGTERM to exit {_stops(result)}"
    )


def _stops(result: dict[str, Any]) -> str:
    """SIGTERM to exit of both starts; runs recorded before the bench timed stops have none."""
    cold, warm = result["cold"], result["warm"]
    if "stop_s" not in cold:
        return "not measured"
    killed = [phase for phase in ("cold", "warm") if result[phase]["engine_core_killed"]]
    return f"{cold['stop_s']:.1f} s, {warm['stop_s']:.1f} s" + (
        f" (engine core SIGKILLed by vLLM: {', '.join(killed)})" if killed else ""
    )


def section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    head = ["model", "cold: start to ready", "warm", "vLLM engine init cold", "warm", "warm start", "SIGTERM to exit"]
    lines = [row(head), row(["---"] * len(head))]
    for w in results["warm_start"]:
        cold, warm = w["cold"], w["warm"]
        how = "loaded the compiled graph" if warm["loaded_compiled"] and not warm["compiled_and_saved"] else "compiled"
        lines.append(
            row(
                [
                    w["name"],
                    f"{cold['ready_s']:.0f} s",
                    f"{warm['ready_s']:.0f} s",
                    f"{cold['engine_init_s']} s",
                    f"{warm['engine_init_s']} s",
                    how,
                    _stops(w),
                ]
            )
        )
    return [
        "Start to ready with torch.compile (`bench/parts/warm_start.py`): a fresh cache directory, then the same one again;",
        "each start's stop from SIGTERM to the exit of the server (after its engine processes).",
        "",
        *lines,
        "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="default: the bench model (built on first use)")
    ap.add_argument("--default-model", action="store_true", help="the service's default model instead")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "bench-warm-start")
    args = ap.parse_args()
    model = None
    if not args.default_model:
        from harness.models import ensure_bench_model
        from service.settings import default_cache_dir

        model = args.model or ensure_bench_model(default_cache_dir())
    args.out.mkdir(parents=True, exist_ok=True)
    result = measure(model, args.out, {"kv_cache_gib": "1"})
    (args.out / "warm_start.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
