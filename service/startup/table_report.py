"""`detect --models`: every model of the `models` table planned on this machine before anything starts, each in its
share of the memory (service/policy/model_table.py), and what of the table fits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from service.policy.memory import gib
from service.policy.model_table import loaded_at_once, table_errors
from service.settings import ListedModel, Settings
from service.startup import build_report, choose_model, fetch_model
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
    models: tuple[Listed, ...]
    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "loaded_at_once": self.engines,
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
        table = Table(title=f"the model table: {self.engines} engine(s) loaded at once, the memory split evenly")
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
        for error in self.errors:
            console.print(f"[red]error:[/red] {error}")


def plan_table(settings: Settings, cpuinfo: Path | None = None, sysfs: Path | None = None) -> TableReport:
    """Each listed model's plan in its share, and alone where the share does not hold it; nothing is downloaded."""
    engines = loaded_at_once(settings)
    listed = []
    for entry in settings.models:
        own = settings.for_listed(entry)
        choice = fetch_model(choose_model(own, build_demo=False), own, download=False)
        report = build_report(own, model=choice, cpuinfo=cpuinfo, sysfs=sysfs, engines=engines)
        alone = report if report.ok or engines == 1 else build_report(own, model=choice, cpuinfo=cpuinfo, sysfs=sysfs)
        listed.append(Listed(entry, report, alone.errors))
    errors = table_errors(settings.models, engines, [(m.report.errors, m.alone_errors) for m in listed])
    return TableReport(engines, tuple(listed), errors)


def listed_name_of(m: Listed) -> str:
    """The name clients use for a listed model: its entry's, else its served name."""
    return m.entry.name or str(_decided(m.report, "model.served_name") or m.entry.source)


def _decided(report: StartupReport, setting: str) -> Any:
    return next((d.value for d in report.decisions if d.setting == setting), None)


def _bytes(n: Any) -> str:
    return gib(n) if isinstance(n, int) else ""
