"""What a bench part hands back: its raw results (stored under its key in results.json), the comparisons and decode
results the report tabulates and plots, and its summary lines."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.stats import Comparison, DecodeResult


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Output:
    data: Any  # JSON: a dict, or a list where the part measures several things alike
    comparisons: tuple[Comparison, ...] = ()
    decoded: tuple[DecodeResult, ...] = ()
    summary: tuple[str, ...] = ()

    @classmethod
    def logged(cls, data: Any, *summary: str) -> Output:
        """Raw results whose summary lines are also logged as the part ends."""
        for line in summary:
            log(line)
        return cls(data, summary=summary)
