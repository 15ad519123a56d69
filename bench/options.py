"""The options of a bench run: what every A/B comparison shares, which parts run, and each part's own options (a
dataclass per part, declared with the part in bench/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import REPO

RESULTS = REPO / "bench" / "results"


@dataclass(frozen=True)
class BenchOptions:
    parts: frozenset[str]  # the parts that run (bench/registry.py names)
    part_options: dict[str, Any] = field(default_factory=dict)  # part name -> its options dataclass
    quick: bool = False
    concurrencies: tuple[int, ...] = (1, 4, 16)
    repetitions: int = 4  # restarts of both servers per comparison, start order alternating
    # Pairs of runs per concurrency on each pair of server processes, 1-3 s a run, A/B and B/A by turns: this
    # machine's speed drifts over seconds (one server's API CPU per request: autocorrelation 0.71 between
    # consecutive requests, 0.33 ten requests apart), and back-to-back runs of ~8 s differed by 6.8% (sd). With
    # short alternating runs (and the CPU counted to the ns) the c=4/16 intervals narrowed 2-6x (docs/benchmarks.md).
    rounds: int = 16
    input_len: int = 128
    output_len: int = 64
    prompts: dict[int, int] = field(default_factory=lambda: {1: 4, 4: 12, 16: 32})  # per run: 2-3 waves of requests
    profile: bool = True  # py-spy on the API processes and on the decode engine process, in extra (uncounted) runs
    results_dir: Path = RESULTS

    def num_prompts(self, concurrency: int) -> int:
        return self.prompts.get(concurrency, 4 * concurrency)

    def of(self, part: str) -> Any:
        """The options of one part (its dataclass)."""
        return self.part_options[part]


# What --quick changes besides running only the parts marked quick: c=4 only, 2 repetitions (< 5 min).
QUICK = dict(quick=True, concurrencies=(4,), repetitions=2, rounds=8, prompts={4: 12}, profile=False)
