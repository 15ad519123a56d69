"""The service's bf16-weight kernel (service/kernels/bf16_linear.py) against fp32 weights, per number of rows, on the
bench model's fused shapes: what the policy's bf16_weights default rests on, and where its GEMV hands batches to
the widen-then-GEMM path (DENSE_FROM_ROWS).

  .venv/bin/python -m bench.tools.bf16_weights [--threads 1] [--reps 100] [--activations bf16]

One process, `--threads` torch threads, random bf16 weights (fp32 copies of the same values for the fp32 side), fp32
activations. Each row count prints ms per pass over the 4 shapes for the kernel's GEMV, its widen-then-GEMM path and
torch's fp32 GEMM on fp32 weights, and the largest difference from the fp32 GEMM's output. `--activations bf16`: a
bf16 engine's case, against the GEMM vLLM's CPU dispatch runs for bf16 weights (oneDNN's, which converts bf16 in
software on a CPU without native bf16). To see an AVX2-only CPU's
code paths on a newer one, restrict torch's libraries (ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
ONEDNN_MAX_CPU_ISA=AVX2) and build the kernel with -march=haswell (as claim/bf16-weights-handover/zen4 was measured).
"""

from __future__ import annotations

import argparse
import functools

from bench.tools.ggml_prefill import SHAPES, ms_per_call

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def main() -> None:
    import torch

    from service.kernels.bf16_linear import DENSE_FROM_ROWS, load_library

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--activations", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    load_library()
    torch.set_num_threads(args.threads)
    op = torch.ops.service_bf16.linear
    bf16 = [(torch.randn(n, k) * 0.02).to(torch.bfloat16) for n, k in SHAPES]
    fp32 = [w.float() for w in bf16]
    size = sum(w.numel() * 2 for w in bf16)
    act = torch.bfloat16 if args.activations == "bf16" else torch.float32
    theirs = "fp32 weights"
    gemms = [functools.partial(torch.nn.functional.linear, weight=w) for w in fp32]
    if act == torch.bfloat16:
        from vllm import _custom_ops as ops

        theirs = "vLLM's bf16 GEMM"
        handles = [ops.create_onednn_mm(w.t(), 32) for w in bf16]
        gemms = [functools.partial(ops.onednn_mm, h, bias=None) for h in handles]
    print(
        f"threads {args.threads}, {torch.backends.cpu.get_cpu_capability()}, {args.activations} activations; the "
        f"kernel's GEMV hands over from {DENSE_FROM_ROWS[str(act).removeprefix('torch.')]} rows"
    )
    for rows in ROWS:
        xs = [torch.randn(rows, k).to(act) for _, k in SHAPES]
        reps = max(3, args.reps // rows)

        def run(dense_from: int, xs: list[torch.Tensor] = xs) -> list[torch.Tensor]:
            return [op(x, w, None, dense_from) for x, w in zip(xs, bf16, strict=True)]

        def plain_run(xs: list[torch.Tensor] = xs) -> list[torch.Tensor]:
            return [gemm(x) for x, gemm in zip(xs, gemms, strict=True)]

        gemv, widen, plain = (
            ms_per_call(lambda: run(0), reps),
            ms_per_call(lambda: run(1), reps),
            ms_per_call(plain_run, reps),
        )
        ref = torch.nn.functional.linear(xs[2].float(), fp32[2])
        diff = ((op(xs[2], bf16[2], None, 0).float() - ref).abs().max() / ref.abs().max()).item()
        print(
            f"rows {rows:4d}: GEMV {gemv:7.2f} ms ({size / gemv / 1e6:5.1f} GB/s), widen + GEMM {widen:7.2f} ms, "
            f"{theirs} {plain:7.2f} ms: x{plain / gemv:.2f} / x{plain / widen:.2f}; difference {diff:.1e}"
        )


if __name__ == "__main__":
    main()
