"""`python -m bench [--quick] ...`: JSON, Markdown table and PNG plots under bench/results/<stamp>/; the last line is
the front-end throughput ratio ours/vLLM with its 95% interval. Every part of bench/registry.py has `--<part>` /
`--no-<part>`, `--only-<part>` and a `--<part>-<option>` for each of its options."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import typing
from pathlib import Path
from typing import Any

from bench.options import QUICK, BenchOptions
from bench.registry import PARTS, Part
from bench.runner import run_bench


def _option_flags(p: argparse.ArgumentParser, part: Part) -> None:
    if part.options is None:
        return
    hints = typing.get_type_hints(part.options)
    for f in dataclasses.fields(part.options):
        flag, kind = f"--{part.name}-{f.name.replace('_', '-')}", hints[f.name]
        dest = f"{part.name}:{f.name}"
        if kind in (int, float, str):
            p.add_argument(flag, type=kind, dest=dest, metavar=f.name.upper(), help=f"default {f.default}")
        elif kind is bool:
            p.add_argument(
                flag, action=argparse.BooleanOptionalAction, dest=dest, default=None, help=f"default {f.default}"
            )
        elif typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            p.add_argument(
                flag, type=item, action="append", dest=dest, metavar=f.name.upper(), help="repeat for several"
            )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    flag = argparse.BooleanOptionalAction
    p.add_argument("--quick", action="store_true", help="the quick parts at c=4 only, 2 repetitions (< 5 min)")
    p.add_argument("--repetitions", type=int, help="server restarts per comparison (start order alternating)")
    p.add_argument("--rounds", type=int, help="A/B pairs per concurrency on each pair of server processes")
    p.add_argument("--concurrency", type=int, action="append", help="repeat for several (default 1, 4, 16)")
    p.add_argument("--profile", action=flag, default=None, help="py-spy on the API and decode engine processes")
    for part in PARTS:
        p.add_argument(f"--{part.name}", action=flag, default=None, dest=f"run:{part.name}", help=part.help)
        p.add_argument(f"--only-{part.name}", action="store_true", dest=f"only:{part.name}", help=f"{part.name} alone")
        _option_flags(p, part)
    p.add_argument("--results-dir", type=Path, help="default bench/results")
    p.add_argument("--render", type=Path, metavar="RUN_DIR", help="rewrite table.md and plots of a finished run")
    return p


def options(args: argparse.Namespace) -> BenchOptions:
    given = vars(args)
    only = {part.name for part in PARTS if given[f"only:{part.name}"]}
    if only:
        parts = only
    else:
        parts = {part.name for part in PARTS if part.quick or not args.quick}
        parts |= {part.name for part in PARTS if given[f"run:{part.name}"]}
        parts -= {part.name for part in PARTS if given[f"run:{part.name}"] is False}
    part_options: dict[str, Any] = {}
    for part in PARTS:
        chosen = part.defaults()
        if chosen is not None:
            overrides = {
                f.name: tuple(v) if isinstance(v, list) else v
                for f in dataclasses.fields(chosen)
                if (v := given.get(f"{part.name}:{f.name}")) is not None
            }
            chosen = dataclasses.replace(chosen, **overrides)
        part_options[part.name] = chosen
    general = {
        "repetitions": args.repetitions,
        "rounds": args.rounds,
        "concurrencies": tuple(args.concurrency) if args.concurrency else None,
        "profile": args.profile,
        "results_dir": args.results_dir,
    }
    base = QUICK if args.quick else {}
    return BenchOptions(
        frozenset(parts), part_options, **{**base, **{k: v for k, v in general.items() if v is not None}}
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.render:
        from bench.report import render

        render(args.render)
        print((args.render / "table.md").read_text())
        return 0
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    return run_bench(options(args), command=command)


if __name__ == "__main__":
    raise SystemExit(main())
