"""Shared fixtures for the fast unit tests: recorded machines and model configs, no engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.facts.software import SoftwareFacts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CPUINFO = FIXTURES / "cpuinfo"
SYSFS = FIXTURES / "sysfs"
MODELS = FIXTURES / "models"


def software(
    zentorch_usable: bool = True, auto_round_lib: str | None = "0.16.0", ggml_kernel: str | None = None
) -> SoftwareFacts:
    reason = "zentorch 2.13.0.1 matches torch 2.13.0+cpu" if zentorch_usable else "zentorch is not installed"
    return SoftwareFacts(
        service="0.1.0",
        torch="2.13.0+cpu",
        vllm="0.32.0",
        zentorch="2.13.0.1" if zentorch_usable else None,
        zentorch_usable=zentorch_usable,
        zentorch_reason=reason,
        auto_round_lib=auto_round_lib,
        ggml_kernel=ggml_kernel,
    )


@pytest.fixture
def with_zentorch() -> SoftwareFacts:
    return software(True)


@pytest.fixture
def without_zentorch() -> SoftwareFacts:
    return software(False)


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """The files whose header gguf-py parsed (its `GGUFReader._build_fields`), in order."""
    from gguf.gguf_reader import GGUFReader

    seen: list[str] = []
    build = GGUFReader._build_fields

    def counted(self, offs, count):
        seen.append(os.path.basename(self.data.filename))
        return build(self, offs, count)

    monkeypatch.setattr(GGUFReader, "_build_fields", counted)
    return seen
