"""A GGUF file's first start before the engine: its facts (`inspect_model`) and its conversion (`ensure_converted`),
each on a fresh copy of the file and a fresh cache dir, with gguf-py's header parse shared within each
(service/facts/gguf_reader.py, the service) and without (every caller parsing the header itself, as before), in
alternating order. Imports are done before the clock starts.

  .venv/bin/python -m bench.tools.gguf_first_start [--model FILE.gguf] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock


def first_start(source: Path, work: Path) -> tuple[float, float]:
    """Seconds of (facts, conversion) of a fresh copy of `source`."""
    from service.facts.model import inspect_model
    from service.facts.software import read_software
    from service.facts.vllm_source import read_vllm_names
    from service.models.gguf_convert import ensure_converted
    from service.policy.gguf.model_source import plan_model_source

    path = work / source.name
    shutil.copy(source, path)
    architectures = read_vllm_names().text_generation_architectures
    started = time.perf_counter()
    facts = inspect_model(str(path))
    read = time.perf_counter() - started
    plan = plan_model_source(facts, "float32", work / "cache", read_software(), architectures)
    assert plan.conversion is not None, f"{source} is not a GGUF file"
    started = time.perf_counter()
    ensure_converted(plan.conversion)
    return read, time.perf_counter() - started


def unshared() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for module in ("service.facts.gguf", "service.models.gguf_convert"):
        stack.enter_context(mock.patch(f"{module}.shared_readers", contextlib.nullcontext))
    return stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the default model's)")
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    import transformers  # noqa: F401  (imported before the clock)

    from service.facts.model import packaged_default_model_path

    source = args.model or packaged_default_model_path()
    assert source is not None, "no GGUF file: pass --model, or install the default model (make setup)"
    times: dict[str, list[tuple[float, float]]] = {"shared": [], "unshared": []}
    for repetition in range(args.repetitions):
        for way in ("shared", "unshared") if repetition % 2 == 0 else ("unshared", "shared"):
            with tempfile.TemporaryDirectory() as work, unshared() if way == "unshared" else contextlib.nullcontext():
                times[way].append(first_start(source, Path(work)))
    print(f"{source.name}, {args.repetitions} repetitions, median (min-max) s")
    print("| header parse | facts | conversion |\n| --- | --- | --- |")
    for way, runs in times.items():
        cells = [f"{statistics.median(x):.2f} ({min(x):.2f}-{max(x):.2f})" for x in zip(*runs, strict=True)]
        print(f"| {way} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
