"""The unit every policy produces: a value with the reason for it and who chose it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["default", "policy", "user"]


@dataclass(frozen=True)
class Decision:
    setting: str  # "engine.<vLLM engine argument>" or "env.<variable>" or "worker_env.<variable>"
    value: Any
    reason: str
    source: Source

    def as_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "value": self.value, "reason": self.reason, "source": self.source}
