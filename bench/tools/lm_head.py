"""Whether a GGUF file's LM head (its output tensor, or the token embedding it ties to) should keep its blocks: ggml's
matmul on the blocks against the head the engine ran before, the blocks dequantized to the engine dtype and
multiplied by torch (F.linear, which vLLM's CPU dispatch calls for an embedding-tied head), per number of rows (the
sequences of a decode step; vLLM computes logits for the last token of each sequence only).

  .venv/bin/python -m bench.tools.lm_head [--threads 2] [--reps 50] [--type Q8_0] [--vocab 49152] [--hidden 576] [--cold]

The defaults are SmolLM2-135M's tied Q8_0 embedding. One process, `--threads` torch threads, one weight slice per
thread as the engine loads them, random values (the kernels' speed does not depend on them); ms per call, median.
`--cold`: a 1 GiB buffer is written between calls (not timed), so the head comes from memory as in a decode step,
where the other layers' weights pass through the caches between two heads; without it a head of a few tens of MB
stays in a large L3.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

ROWS = (1, 4, 16, 64)


def median_ms(run: Callable[[], object], reps: int, between: Callable[[], object] | None = None) -> float:
    run()
    times = []
    for _ in range(reps):
        if between is not None:
            between()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from bench.tools.ggml_prefill import planned_rows
    from harness.ggml_blocks import blocks_of
    from service.kernels.ggml_linear import load_library
    from service.policy.gguf.model_source import BLOCK_TYPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--type", choices=BLOCK_TYPES, default="Q8_0")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--cold", action="store_true", help="evict the caches between calls")
    args = parser.parse_args()
    load_library()
    torch.set_num_threads(args.threads)
    kind = GGMLQuantizationType[args.type]
    rng = np.random.default_rng(0)
    blocks = blocks_of(rng.standard_normal((args.vocab, args.hidden), dtype=np.float32) * 0.02, args.type, rng)
    handle = torch.ops.service_ggml.load(torch.from_numpy(blocks), kind.value, args.hidden, args.vocab, args.threads)
    values = torch.from_numpy(dequantize(blocks, kind).reshape(args.vocab, args.hidden))
    flush = torch.empty(1 << 30, dtype=torch.uint8) if args.cold else None
    between = (lambda: flush.fill_(1)) if flush is not None else None
    state = "caches evicted between calls" if args.cold else "warm caches"
    print(
        f"{args.type} head {args.vocab}x{args.hidden}, threads {args.threads}, {state}; "
        f"ms per call, median of {args.reps}"
    )
    for dtype in (torch.bfloat16, torch.float32):
        weight = values.to(dtype).contiguous()
        dense_from, _ = planned_rows(args.type, str(dtype).removeprefix("torch."))
        for rows in ROWS:
            x = torch.randn(rows, args.hidden, dtype=dtype)
            ggml = median_ms(
                functools.partial(torch.ops.service_ggml.linear, x, handle, args.vocab, None, dense_from),
                args.reps,
                between,
            )
            dense = median_ms(functools.partial(torch.nn.functional.linear, x, weight), args.reps, between)
            print(
                f"{str(dtype).removeprefix('torch.'):8s} rows {rows:3d}: blocks {ggml:6.2f} ms, "
                f"dequantized {dense:6.2f} ms (x{ggml / dense:.2f})"
            )


if __name__ == "__main__":
    main()
