"""Installed software that decides what can run: torch, vLLM and zentorch versions."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SoftwareFacts:
    service: str
    torch: str | None
    vllm: str | None
    zentorch: str | None  # installed version, or None
    zentorch_usable: bool  # importable against the installed torch
    zentorch_reason: str  # why (not) usable, for the backend reason


def read_software() -> SoftwareFacts:
    raise NotImplementedError
