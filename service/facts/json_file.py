"""A model directory's JSON files (config.json, tokenizer.json, ...) read with the file named in any error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any]:
    """The parsed object; a ValueError naming the file when it is not JSON (a bare parser message names no file)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name} is not valid JSON: {exc}") from exc
    return data
