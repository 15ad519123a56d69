"""`python -m bench [--quick] ...`: JSON, Markdown table and PNG plots under bench/results/<stamp>/; the last line is
the front-end throughput ratio ours/vLLM with its 95% interval."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from bench.runner import BenchOptions, run_bench


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    flag = argparse.BooleanOptionalAction
    p.add_argument("--quick", action="store_true", help="front end at c=4 only, 2 repetitions (< 5 min)")
    p.add_argument("--repetitions", type=int, help="server restarts per comparison (start order alternating)")
    p.add_argument("--rounds", type=int, help="A/B pairs per concurrency on each pair of server processes")
    p.add_argument("--concurrency", type=int, action="append", help="repeat for several (default 1, 4, 16)")
    p.add_argument("--frontend", action=flag, default=None, help="ours vs vLLM's own server")
    p.add_argument("--policy", action=flag, default=None, help="policy vs vLLM defaults")
    p.add_argument("--decode", action=flag, default=None, help="batch-1 decode vs the bandwidth ceiling")
    p.add_argument("--decode-rounds", type=int, help="decode rounds, each between two bandwidth probes (default 6)")
    p.add_argument(
        "--profile", action=flag, default=None, help="py-spy on both API processes and on the decode engine process"
    )
    p.add_argument("--preload", action=flag, default=None, help="native decode with and without the preload")
    p.add_argument("--preload-repetitions", type=int)
    p.add_argument("--dtype", action=flag, default=None, help="decode bf16 against fp32, side by side")
    p.add_argument("--dtype-repetitions", type=int)
    p.add_argument("--warm-start", action=flag, default=None, help="start to ready, cold and warm compile cache")
    p.add_argument("--quant", action=flag, default=None, help="quantized linear kernels per format")
    p.add_argument("--quant-repetitions", type=int)
    p.add_argument("--peer", action=flag, default=None, help="llama.cpp's server (built by `make bench-tools`)")
    p.add_argument("--only-peer", action="store_true", help="the llama.cpp peer alone")
    p.add_argument("--peer-format", action="append", choices=("bf16", "q8_0", "q4_0"), help="repeat for several")
    p.add_argument("--peer-repetitions", type=int)
    p.add_argument("--results-dir", type=Path, help="default bench/results")
    p.add_argument("--render", type=Path, metavar="RUN_DIR", help="rewrite table.md and plots of a finished run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.render:
        from bench.report import render

        render(args.render)
        print((args.render / "table.md").read_text())
        return 0
    opts = BenchOptions.quick_mode() if args.quick else BenchOptions()
    if args.only_peer:
        opts = replace(
            opts,
            frontend=False,
            policy=False,
            decode=False,
            preload=False,
            dtype=False,
            warm_start=False,
            quant=False,
            peer=True,
        )
    given = {
        "repetitions": args.repetitions,
        "rounds": args.rounds,
        "concurrencies": tuple(args.concurrency) if args.concurrency else None,
        "frontend": args.frontend,
        "policy": args.policy,
        "decode": args.decode,
        "decode_rounds": args.decode_rounds,
        "profile": args.profile,
        "preload": args.preload,
        "preload_repetitions": args.preload_repetitions,
        "dtype": args.dtype,
        "dtype_repetitions": args.dtype_repetitions,
        "warm_start": args.warm_start,
        "quant": args.quant,
        "quant_repetitions": args.quant_repetitions,
        "peer": args.peer,
        "peer_formats": tuple(args.peer_format) if args.peer_format else None,
        "peer_repetitions": args.peer_repetitions,
        "results_dir": args.results_dir,
    }
    opts = replace(opts, **{k: v for k, v in given.items() if v is not None})
    return run_bench(opts, command=shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    raise SystemExit(main())
