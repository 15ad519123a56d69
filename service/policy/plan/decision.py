"""What every policy produces: decisions (a value with the reason for it and who chose it), warnings and errors.

A decision is of a kind: an engine argument, an environment variable the service sets before vLLM starts, or a
record of something decided elsewhere (what vLLM sets per worker, what vLLM applies itself, what the user's
environment already holds, a model, a quantization or a pre-flight verdict). `passed` says whether the service hands
it to vLLM; the engine arguments and the environment are read off the passed decisions, so what the report shows and
what vLLM gets are one list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from service.in_vllm.contract import BY_NAME

Source = Literal["default", "policy", "calibration", "user"]
# engine: a vLLM engine argument; env: set in the service's environment before vLLM spawns (every vLLM process
# inherits it); worker_env: set by vLLM itself in each worker; the rest are records.
Kind = Literal[
    "engine", "env", "worker_env", "model", "quant", "preflight", "patch", "topology", "calibration", "access"
]


@dataclass(frozen=True)
class Decision:
    kind: Kind
    name: str
    value: Any
    reason: str
    source: Source
    passed: bool = False  # handed to vLLM: an engine argument it gets, or a variable set before it starts

    @property
    def setting(self) -> str:
        return f"{self.kind}.{self.name}"

    def as_dict(self) -> dict[str, Any]:
        """The report's form (its JSON contract); what is passed is exported apart, as engine_args and env."""
        return {"setting": self.setting, "value": self.value, "reason": self.reason, "source": self.source}


def engine(name: str, value: Any, reason: str, source: Source) -> Decision:
    """An engine argument, passed unless None (left to vLLM)."""
    return Decision("engine", name, value, reason, source, passed=value is not None)


def env(name: str, value: str, reason: str, source: Source) -> Decision:
    """A variable the service sets before vLLM starts: one the contract with vLLM's processes lists."""
    if name not in BY_NAME:
        raise ValueError(f"{name} is handed to vLLM's processes but not listed in service/in_vllm/contract.py")
    return Decision("env", name, value, reason, source, passed=True)


def record(kind: Kind, name: str, value: Any, reason: str, source: Source) -> Decision:
    """Decided, and shown, but not handed over by the service (vLLM or the user's environment applies it)."""
    return Decision(kind, name, value, reason, source)


@dataclass(frozen=True)
class PolicyResult:
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @classmethod
    def of(cls, *decisions: Decision | None, warnings: Iterable[str] = (), errors: Iterable[str] = ()) -> PolicyResult:
        return cls(tuple(d for d in decisions if d is not None), tuple(warnings), tuple(errors))

    def __add__(self, other: PolicyResult) -> PolicyResult:
        return PolicyResult(
            self.decisions + other.decisions, self.warnings + other.warnings, self.errors + other.errors
        )

    @staticmethod
    def merge(results: Iterable[PolicyResult]) -> PolicyResult:
        total = PolicyResult()
        for result in results:
            total += result
        return total

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def engine_args(self) -> dict[str, Any]:
        """kwargs for vLLM's AsyncEngineArgs: the passed engine decisions."""
        return {d.name: d.value for d in self.decisions if d.kind == "engine" and d.passed}

    @property
    def env(self) -> dict[str, str]:
        """Set in the service's process before vLLM starts: the passed environment decisions."""
        return {d.name: str(d.value) for d in self.decisions if d.kind == "env" and d.passed}

    def find(self, setting: str) -> Decision | None:
        return next((d for d in self.decisions if d.setting == setting), None)
