"""`python -m bench`: runs the parts of bench/registry.py in order, each as soon as the previous ends, and writes
results.json, table.md and the plots under bench/results/<stamp>/."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
from dataclasses import asdict
from typing import Any

from bench import servers as srv
from bench.context import Context, cache_dir, ours_ready, start
from bench.options import BenchOptions
from bench.output import log
from bench.registry import PARTS
from bench.stats import Comparison, DecodeResult, headline


def run_bench(opts: BenchOptions, command: str | None = None) -> int:
    from bench import report as rep
    from service.models.demo_model import DEMO_NAME, ensure_demo_model

    started = dt.datetime.now()
    stamp = started.strftime("%Y%m%d-%H%M%S") + ("-quick" if opts.quick else "")
    out = opts.results_dir / stamp
    (out / "logs").mkdir(parents=True, exist_ok=True)
    command = command or "python -m bench" + (" --quick" if opts.quick else "")
    log(f"results in {out}")
    ctx = Context(opts, out, str(ensure_demo_model(cache_dir())), DEMO_NAME)
    results: dict[str, Any] = {
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "options": _json_options(opts),
        "model": {"path": ctx.model, "served_name": ctx.served},
        "host": {"python": platform.python_version(), "kernel": platform.release(), "loadavg_start": os.getloadavg()},
        "note": "2 cores shared with other workers: absolute numbers are noisy; ratios are paired, with intervals",
    }
    comparisons: list[Comparison] = []
    decoded: list[DecodeResult] = []
    summary: list[str] = []
    for part in PARTS:
        if part.name not in opts.parts:
            continue
        output = part.run(ctx, opts.of(part.name))
        results[part.key] = output.data
        comparisons += output.comparisons
        decoded += output.decoded
        summary += output.summary
        # Each part's raw results as soon as it ends: a later part that fails does not lose them.
        (out / "results.partial.json").write_text(json.dumps(results, indent=2, default=_json_default))
    if ctx.reported is None:  # nothing started the service: its report once, for the machine facts
        server = start(srv.ours(ctx.model, ctx.served, ctx.logdir / "server-report.log"), ctx)
        try:
            ours_ready(ctx, lambda: None)(server)
        finally:
            server.close()

    assert ctx.reported is not None  # set by a part or by the hook above
    results["machine"] = ctx.reported.machine() | {"client": asdict(ctx.client) if ctx.client else None}
    results["policy"] = {"engine_args": ctx.reported.engine_args, "env": ctx.reported.env}
    results["parity"] = ctx.parity
    results["startup_s"] = ctx.startup_s
    results["comparisons"] = [c.as_dict() for c in comparisons]
    results["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    results["host"]["loadavg_end"] = os.getloadavg()
    during = [r["loadavg_1m"] for r in _all_runs(results)]
    results["host"]["loadavg_1m_max_during_runs"] = max(during) if during else None
    results["summary"] = summary
    front = [c for c in comparisons if c.name == "frontend"]
    results["headline"] = headline(front) if front else None
    (out / "results.json").write_text(json.dumps(results, indent=2, default=_json_default))
    (out / "table.md").write_text(rep.markdown(results, comparisons, decoded))
    plots = rep.plots(out, comparisons, decoded, results)
    latest = opts.results_dir / ("latest-quick" if opts.quick else "latest")
    with contextlib.suppress(FileNotFoundError):
        latest.unlink()
    latest.symlink_to(out.name)
    log(f"wrote {out / 'results.json'}, {out / 'table.md'}, {', '.join(p.name for p in plots)}")
    if ctx.client:
        print(ctx.client.note)
    for line in results["summary"]:
        print(line)
    if results["headline"]:
        print(results["headline"])
    return 0


def _json_options(opts: BenchOptions) -> dict[str, Any]:
    general = {k: (str(v) if k == "results_dir" else v) for k, v in asdict(opts).items() if k != "part_options"}
    general["parts"] = sorted(opts.parts)
    general["part_options"] = {name: asdict(o) for name, o in opts.part_options.items() if o is not None}
    return general


def _all_runs(results: dict[str, Any]) -> list[dict[str, Any]]:
    parts = ("frontend", "policy_vs_defaults", "peer")
    return [r for part in parts if isinstance(results.get(part), dict) for r in results[part].get("runs", [])]


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    return str(obj)
