"""The measurement store: every figure a decision rests on, as rows of data in service/measurements/*.yaml.

A row holds its key, the CPU class and machine it was measured on, the command, the date, the value with its
interval (95%, over paired runs) or spread (min-max over repetitions), and what the run showed in words. Policy
code names rows by key and renders them with `cite`, so a figure, its command and its date are written once, here as
data; `python -m bench.tools.promote` adds a run's rows and `make docs` renders the documents' tables from the same rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, field_validator

STORE = Path(__file__).resolve().parent


class Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str  # "<kind>/...": unique across the store
    cpu: str  # CPU class: zen1 ... zen5, emeraldrapids, sapphirerapids-amx, ... (what `service detect` names)
    machine: str  # the machine as it showed itself
    command: str
    date: str  # YYYY-MM-DD, with HH:MM where the run has it
    value: float | None = None
    unit: str = ""
    interval: tuple[float, float] | None = None  # 95% interval of a ratio over paired runs
    spread: tuple[float, float] | None = None  # min-max over repetitions
    says: str = ""  # what the run showed, in words
    params: dict[str, Any] = {}  # what the figure is of (format, kernel, concurrency, a table's rows, ...)
    run: str = ""  # bench/results/<stamp>, where the run kept its raw results

    @field_validator("date", mode="before")
    @classmethod
    def _date_as_written(cls, value: Any) -> Any:
        # YAML reads an unquoted YYYY-MM-DD as a date
        return value.isoformat() if hasattr(value, "isoformat") else value

    @property
    def kind(self) -> str:
        return self.key.split("/", 1)[0]

    def figure(self) -> str:
        if self.value is None:
            return ""
        text = f"{self.value:g}{self.unit}" if not self.unit.startswith("x") else f"x{self.value:g}{self.unit[1:]}"
        if self.interval:
            text += f" [{self.interval[0]:g}, {self.interval[1]:g}]"
        elif self.spread:
            text += f" [{self.spread[0]:g}-{self.spread[1]:g}]"
        return text

    def source(self) -> str:
        """The command, the machine and the date: where the figure comes from."""
        return f"{self.command}; {self.machine}; {self.date}"


class Store:
    def __init__(self, rows: Iterable[Row]) -> None:
        self.rows: dict[str, Row] = {}
        for row in rows:
            if row.key in self.rows:
                raise ValueError(f"measurement {row.key} is in the store twice")
            self.rows[row.key] = row

    def __getitem__(self, key: str) -> Row:
        try:
            return self.rows[key]
        except KeyError:
            raise KeyError(f"no measurement {key!r} in {STORE}") from None

    def of_kind(self, kind: str) -> list[Row]:
        return [r for r in self.rows.values() if r.kind == kind]


def read_store(directory: Path = STORE) -> Store:
    rows: list[Row] = []
    for path in sorted(directory.glob("*.yaml")):
        # libyaml's loader: the pure-Python one took about 0.3 s for the store, in every process that imports policy
        for raw in yaml.load(path.read_text(), Loader=yaml.CSafeLoader) or []:
            rows.append(Row(**raw))
    return Store(rows)


@cache
def store() -> Store:
    return read_store()


def row(key: str) -> Row:
    return store()[key]


def cite(key: str) -> str:
    """A row as a reason quotes it: what was measured, the figure, and where it comes from, under its key."""
    r = row(key)
    figure = r.figure()
    what = "; ".join(part for part in (r.says, figure if figure and figure not in r.says else "") if part)
    return f"{what} (measured: {r.key}; {r.source()})"
