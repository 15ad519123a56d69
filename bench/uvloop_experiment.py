"""Experiment behind docs/bench.md's front-end note: our service as is (stdlib asyncio loop, since run.py
calls asyncio.run) vs the same service on uvloop (what vLLM's own server runs on), vs vLLM's server.

    .venv/bin/python bench/uvloop_experiment.py [repetitions]

Same workloads and pairing as `python -m service bench`; prints one summary line per concurrency."""
from __future__ import annotations

import sys
from pathlib import Path

from service.bench import servers as srv
from service.bench.runner import BenchOptions, _paired_runs, _start, _warm, log, policy_report
from service.bench.stats import compare, summary_line
from service.demo_model import DEMO_NAME, ensure_demo_model

UVLOOP_SERVE = (
    "import asyncio, sys, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy()); "
    "sys.argv = ['service', 'serve']; from service.__main__ import app; app()"
)


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    opts = BenchOptions(repetitions=reps, policy=False, decode=False, profile=False)
    out = opts.results_dir / "uvloop-experiment"
    logdir = out / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    settings, _ = policy_report("", {})
    model = str(ensure_demo_model(settings.cache_dir))
    settings, report = policy_report(model, {})
    asis = srv.ours(model, DEMO_NAME, {}, logdir / "server-ours.log")
    uv = srv.ours(model, DEMO_NAME, {}, logdir / "server-ours-uvloop.log")
    uv.name, uv.argv = "ours-uvloop", ["-c", UVLOOP_SERVE]
    vllm = srv.vllm_with_policy(model, DEMO_NAME, report, settings.max_queued_requests, logdir / "server-vllm.log")
    live = []
    try:
        for s in (asis, uv, vllm):
            live.append(_start(s))
            _warm(s, opts, model, DEMO_NAME, logdir)
        lines = []
        for pair in ((asis, vllm), (uv, vllm), (uv, asis)):
            runs = _paired_runs("frontend", pair, opts, model, DEMO_NAME, logdir)
            lines += [summary_line(compare("frontend", pair[0].name, pair[1].name, c, runs)) for c in opts.concurrencies]
        (out / "summary.txt").write_text("\n".join(lines) + "\n")
        log(f"wrote {out / 'summary.txt'}")
        print("\n".join(lines))
    finally:
        for s in live:
            s.stop()


if __name__ == "__main__":
    main()
