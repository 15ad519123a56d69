"""Native batch-1 decode with and without the preload the service decides (service/policy/machine/preload.py).

  .venv/bin/python -m bench.parts.preload [--model PATH] [--repetitions 3] [--requests 4] [--max-tokens 128]

"with": the service's own decision (tcmalloc + the backend's OpenMP runtime). "without": what vLLM does on its
own when nothing is preloaded: it preloads torch's GNU OpenMP and no allocator (vllm/platforms/cpu.py); the
benchmark sets exactly that as the user's LD_PRELOAD, which the policy leaves alone. Both run side by side and are
compared in adjacent pairs (bench/paired.py). `measure()` is what the benchmark tool calls; main() prints a table
and writes JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import paired
from bench.context import Context, cache_dir
from bench.output import Output, log
from bench.stats import Comparison, DecodeResult, estimate


def torch_gomp() -> str:
    """The runtime vLLM preloads itself when LD_PRELOAD names no OpenMP runtime."""
    from service.facts.libraries import read_libraries

    gomp = read_libraries().torch_gomp
    if gomp is None:
        raise RuntimeError("torch's libgomp not found: cannot reproduce vLLM's own default preload")
    return str(gomp)


def measure(run: paired.Run) -> dict[str, Any]:
    """with/without per repetition in "ratios", their estimate; each run carries the LD_PRELOAD decision its server
    reported."""
    variants = {"with": {}, "without": {"LD_PRELOAD": torch_gomp()}}
    result = paired.measure(variants, run)
    return result | {"estimate": estimate("decode with/without preload", "ratio", result["ratios"]).fmt()}


@dataclass(frozen=True)
class PreloadOptions:
    repetitions: int = 3


def run(ctx: Context, options: PreloadOptions) -> Output:
    """Batch-1 decode of the bench model served natively with the preload the service decides (allocator + OpenMP
    runtime) and with vLLM's own (torch's GNU OpenMP, no allocator), restarted per repetition in alternating order."""
    log("native decode with and without the service's preload (bench model, restarted per repetition)")
    result = measure(paired.bench_run(cache_dir(), ctx.logdir / "preload", options.repetitions, 128, {}))
    return Output.logged(result, paired.summary(result, "native decode with the service's preload and with vLLM's own"))


def section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    p = results["preload"]
    used = next(
        (
            r["decisions"]["env.LD_PRELOAD"]["value"]
            for r in p["runs"]
            if r["variant"] == "with" and "env.LD_PRELOAD" in r["decisions"]
        ),
        None,
    )
    return [
        f"Native preload (`bench/parts/preload.py`): batch-1 decode of `{Path(p['model']).name}` served by the service "
        f"with its own preload (`LD_PRELOAD={used}`) and with vLLM's (torch's GNU OpenMP, no allocator), "
        f"{len(p['ratios'])} repetitions restarting both (order alternating), "
        f"{p['requests_per_start']} decode rates of {p['max_tokens']} tokens per start: with "
        f"{p['median_tok_s']['with']:.2f} tok/s, without {p['median_tok_s']['without']:.2f} tok/s; "
        f"with/without {p['estimate']}.",
        "",
    ]


def main() -> None:
    paired.cli(measure, __doc__ or "", "preload", max_tokens=128, eager=False)


if __name__ == "__main__":
    main()
