"""Other names for the served model (model_aliases): exact names or glob patterns (`claude-*`, `gpt-*`).

Agents ask for models by their own names (Claude Code for a main model and a small fast one; Codex for its default)
and llama-server answers any name with its one model. Off by default: an unknown name is vLLM's 404, as OpenAI's. A
request whose `model` is served (the model's name, a LoRA adapter's) is never renamed."""

from __future__ import annotations

import fnmatch
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

HEADER = "X-Service-Model-Alias"


@dataclass(frozen=True)
class ModelAliases:
    served: str  # the served model's name, which an alias stands for
    patterns: tuple[str, ...] = ()

    def resolve(self, name: str, served_names: Collection[str] = ()) -> str | None:
        """The served model `name` stands for, None where it is not an alias (or names a served model itself)."""
        if name == self.served or name in served_names:
            return None
        return self.served if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns) else None

    def rename(self, body: Any, served_names: Collection[str] = ()) -> str | None:
        """Renames, in place, a request body's alias to the served model; the header's value when it did."""
        name = body.get("model") if isinstance(body, dict) else None
        if not isinstance(name, str) or (served := self.resolve(name, served_names)) is None:
            return None
        body["model"] = served
        return f"{name} -> {served} (model_aliases)"
