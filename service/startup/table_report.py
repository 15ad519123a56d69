"""`detect --models`: every model of the `models` table planned on this machine before anything starts, each in its
share of the memory (service/policy/engine/model_table.py), and what of the table fits."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from service.policy.engine.memory import gib
from service.policy.engine.model_table import engine_counts, engines_reason, table_errors
from service.policy.machine.table_cpus import CpuPlan
from service.settings import ListedModel, Settings
from service.startup import build_report, fetch_model, table_cpus
from service.startup.model_sources import choose_model
from service.startup.report import StartupReport


@dataclass(frozen=True)
class Listed:
    entry: ListedModel
    report: StartupReport  # planned in its share
    alone_errors: tuple[str, ...]  # of its plan with the whole machine to itself

    @property
    def alone_ok(self) -> bool:
        return not self.alone_errors


@dataclass(frozen=True)
class TableReport:
    engines: int  # loaded at once
    engines_reason: str
    cpus: CpuPlan
    models: tuple[Listed, ...]
    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "loaded_at_once": self.engines,
            "loaded_at_once_reason": self.engines_reason,
            "cpus": {
                "mode": self.cpus.mode,
                "slots": [list(s) for s in self.cpus.slots],
                "reason": self.cpus.decision.reason,
            },
            "models": [
                {
                    "name": listed_name_of(m),
                    "source": m.entry.source,
                    "pinned": m.entry.pinned,
                    "idle_unload": m.entry.idle_unload,
                    "fits_alone": m.alone_ok,
                    "plan": m.report.to_dict(),
                }
                for m in self.models
            ],
            "errors": list(self.errors),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def render(self, console: Console) -> None:
        for m in self.models:
            console.rule(f"{listed_name_of(m)} ({m.entry.source})")
            m.report.render(console)
        table = Table(
            title=f"the model table: {self.engines} engine(s) loaded at once ({self.engines_reason}), the memory split "
            "evenly"
        )
        for column in ("model", "memory share", "KV cache in it", "fits", "pinned", "idle unload"):
            table.add_column(column)
        for m in self.models:
            table.add_row(
                listed_name_of(m),
                _bytes(_decided(m.report, "model.memory_share")),
                _bytes(m.report.plan.engine_args.get("kv_cache_memory_bytes")),
                "yes" if m.report.ok else "alone only" if m.alone_ok else "no",
                "yes" if m.entry.pinned else "",
                f"{m.entry.idle_unload:g} s" if m.entry.idle_unload else "",
            )
        console.print(table)
        console.print(f"CPUs: {self.cpus.decision.reason}")
        for error in self.errors:
            console.print(f"[red]error:[/red] {error}")


def plan_table(
    settings: Settings,
    cpuinfo: Path | None = None,
    sysfs: Path | None = None,
    *,
    download: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> TableReport:
    """Each listed model's plan in its share, and alone where the share does not hold it; a hub model not in the
    cache is downloaded first only with `download` (serve; detect plans from what is here). The number of engines at
    once: the user's, else the most whose shares each hold their model."""
    own = [settings.for_listed(entry) for entry in settings.models]
    choices = [fetch_model(choose_model(o, build_demo=False), o, download=download, progress=progress) for o in own]
    for engines in engine_counts(settings):
        reports = [
            build_report(o, model=c, cpuinfo=cpuinfo, sysfs=sysfs, engines=engines)
            for o, c in zip(own, choices, strict=True)
        ]
        if all(r.ok for r in reports):
            break
    listed = []
    for entry, o, choice, report in zip(settings.models, own, choices, reports, strict=True):
        alone = report if report.ok or engines == 1 else build_report(o, model=choice, cpuinfo=cpuinfo, sysfs=sysfs)
        listed.append(Listed(entry, report, alone.errors))
    errors = table_errors(settings.models, engines, [(m.report.errors, m.alone_errors) for m in listed])
    why = engines_reason(settings, engines, all(r.ok for r in reports))
    cpus = table_cpus(settings, reports[0].hardware, engines)
    return TableReport(engines, why, cpus, tuple(listed), errors)


def listed_name_of(m: Listed) -> str:
    """The name clients use for a listed model: its entry's, else its served name."""
    return m.entry.name or str(_decided(m.report, "model.served_name") or m.entry.source)


def _decided(report: StartupReport, setting: str) -> Any:
    return next((d.value for d in report.decisions if d.setting == setting), None)


def _bytes(n: Any) -> str:
    return gib(n) if isinstance(n, int) else ""
