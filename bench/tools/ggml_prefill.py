"""Where the service's ggml kernels should hand a batch to torch's GEMM: ggml's int8 dot products against
dequantize-then-GEMM, per number of rows, on the bench model's fused shapes in Q4_0 (the int4 kernel), Q8_0 (the
int8 one) or a GGUF block type the service keeps (Q4_1, Q5_0, Q5_1, Q2_K-Q6_K: GgufBlocksLinearMethod).

  .venv/bin/python -m bench.tools.ggml_prefill [--threads 1] [--reps 20] [--type q4_0|q8_0|Q4_1|Q5_0|...|Q6_K]
                                          [--dtype bfloat16|float32]

Why: ggml's matmul reads the weights once per call, which wins at decode (few rows); torch's bf16 GEMM computes
faster per row once enough rows share the weights' reads, even after dequantizing the blocks per call. The
crossover is the table the policy plans per backend and activation dtype (service/policy/linear/ggml_handover.py); the tool
says what it plans for this machine. `--dtype` is the engine's activation dtype: fp32 where the dtype policy picks it (AVX2-only CPUs),
whose GEMM is not bf16's. One process, `--threads` torch threads, one weight slice per thread as the engine loads
them, random values and scales (the kernel's speed does not depend on them; K-quants get random blocks,
harness/ggml_blocks.py); each row count runs both paths in turn and prints ms per pass over the 4 shapes and their
output agreement.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

SHAPES = ((3072, 2048), (2048, 2048), (11264, 2048), (2048, 5632))  # (N, K): qkv, o, gate_up, down
ROWS = (1, 8, 16, 32, 64, 128, 256, 512)


def ms_per_call(run: Callable[[], object], reps: int) -> float:
    run()
    start = time.perf_counter()
    for _ in range(reps):
        run()
    return (time.perf_counter() - start) / reps * 1e3


def planned_rows(type_name: str, dtype: str) -> tuple[int, str]:
    """The row count the policy plans for this machine's backend (as the engine's report says it), and the backend."""
    from service.facts.cpu import read_cpuinfo
    from service.facts.software import read_software
    from service.policy.machine.backend import choose_backend

    entry = choose_backend(read_cpuinfo(), read_software()).entry
    if entry is None:
        raise SystemExit("no backend runs on this machine")
    return (entry.ggml_handover.get(dtype) or entry.ggml_handover["bfloat16"]).row(type_name), entry.name


def main() -> None:
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType

    from harness.ggml_blocks import blocks_of
    from service.kernels.ggml_int8 import Q8_0, q8_0_blocks
    from service.kernels.ggml_linear import Q4_0, load_library, q4_0_blocks
    from service.policy.gguf.model_source import BLOCK_TYPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--type", choices=("q4_0", "q8_0", *BLOCK_TYPES), default="q4_0")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    load_library()
    torch.set_num_threads(args.threads)
    ops = torch.ops.service_ggml
    rng = np.random.default_rng(0)
    weights = []
    for n, k in SHAPES:
        if args.type == "q4_0":
            q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
            blocks, kind = q4_0_blocks(q, torch.rand(n, k // 128) * 0.01), Q4_0
        elif args.type == "q8_0":
            blocks, kind = q8_0_blocks(torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n) * 0.01), Q8_0
        else:  # a GGUF file's rows of blocks, as GgufBlocksLinearMethod loads them
            values = rng.standard_normal((n, k), dtype=np.float32) * 0.02
            blocks = torch.from_numpy(blocks_of(values, args.type, rng))
            kind = GGMLQuantizationType[args.type].value
        weights.append((ops.load(blocks, kind, k, n, args.threads), n, k))
    dense_from, backend = planned_rows(args.type.upper(), args.dtype)
    print(
        f"{args.type}, {args.dtype} activations, threads {args.threads}; the service hands over from {dense_from} rows "
        f"on this machine's backend, {backend} (0: never)"
    )
    for rows in ROWS:
        xs = [torch.randn(rows, k, dtype=dtype) for _, _, k in weights]

        def run(dense_from: int, xs: list[torch.Tensor] = xs) -> list[torch.Tensor]:
            return [ops.linear(x, h, n, None, dense_from) for x, (h, n, _) in zip(xs, weights, strict=True)]

        reps = max(2, args.reps * 4 // rows)
        ggml, dense = ms_per_call(lambda: run(0), reps), ms_per_call(lambda: run(1), reps)
        a, b = run(0)[2].float(), run(1)[2].float()
        agree = ((a - b).abs().max() / b.abs().max()).item()
        print(
            f"rows {rows:4d}: ggml {ggml:7.1f} ms, dequantize + GEMM {dense:7.1f} ms "
            f"(x{ggml / dense:.2f}), max difference {agree:.4f} of the largest output"
        )


if __name__ == "__main__":
    main()
