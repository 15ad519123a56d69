"""Batch-1 decode in bf16 against fp32, side by side: the measurement the dtype policy rests on where the CPU has
no native bf16 (service/policy/engine/dtype.py).

  .venv/bin/python -m bench.parts.dtype [--model PATH] [--repetitions 3] [--requests 4] [--max-tokens 64]

Both dtypes of the same model are served at once and compared in adjacent pairs (bench/paired.py); the report names
the CPU and the ISA class the policy keys on (native bf16, AVX-512 without it, AVX2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import paired
from bench.context import Context, cache_dir
from bench.output import Output, log
from bench.stats import Comparison, DecodeResult, estimate

VARIANTS = {"bfloat16": {"SERVICE_DTYPE": "bfloat16"}, "float32": {"SERVICE_DTYPE": "float32"}}


def measure(run: paired.Run) -> dict[str, Any]:
    """bf16/fp32 per repetition in "ratios", with the CPU it ran on. Callers run it eager: with torch.compile vLLM
    warms up with a prefill of max_num_batched_tokens (2048 tokens) before it is ready, and bf16 without native
    support runs torch's reference GEMM on AVX2 (cpublas bf16_dot_with_fp32_arith: oneDNN refuses the bf16 matmul
    there), which kept the bench model's bf16 start busy for over 10 minutes (AMD EPYC Zen 1 guest, 2026-11-24)."""
    from service.facts.hardware import read_hardware
    from service.facts.software import read_software
    from service.policy.engine.dtype import isa_class
    from service.policy.machine.backend import choose_backend
    from service.policy.machine.backends import BACKENDS

    cpu = read_hardware().cpu
    result = paired.measure(VARIANTS, run, prefill=True)
    return {
        **result,
        "estimate": estimate("decode bf16/fp32", "ratio", result["ratios"]).fmt(),
        "prefill_estimate": estimate("prefill bf16/fp32", "ratio", result["prefill_ratios"]).fmt(),
        "cpu": f"{cpu.vendor} {cpu.model_name} ({cpu.microarchitecture})",
        "isa_class": isa_class(cpu.isa, BACKENDS[choose_backend(cpu, read_software()).name or "avx2"]),
    }


@dataclass(frozen=True)
class DtypeOptions:
    repetitions: int = 3


def run(ctx: Context, options: DtypeOptions) -> Output:
    """Batch-1 decode of the bench model in bf16 and fp32, served side by side, restarted per repetition."""
    log("decode bf16 against fp32, side by side (bench model, restarted per repetition)")
    eager = {"enforce_eager": "true"}  # see measure()
    result = measure(paired.bench_run(cache_dir(), ctx.logdir / "dtype", options.repetitions, 64, eager))
    return Output.logged(
        result, paired.summary(result, f"decode side by side on {result['cpu']} ({result['isa_class']})")
    )


def section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    d = results["dtype"]
    return [
        f"dtype (`bench/parts/dtype.py`) on {d['cpu']} ({d['isa_class']}): batch-1 decode of `{Path(d['model']).name}` "
        f"served in bf16 and in fp32 side by side, {len(d['ratios'])} repetitions restarting both (order "
        f"alternating), {d['requests_per_start']} decode rates of {d['max_tokens']} tokens per start: bf16 "
        f"{d['median_tok_s']['bfloat16']:.2f} tok/s, fp32 {d['median_tok_s']['float32']:.2f} tok/s; "
        f"bf16/fp32 decode {d['estimate']}, prefill {d['prefill_estimate']}.",
        "",
    ]


def main() -> None:
    result = paired.cli(measure, __doc__ or "", "dtype", max_tokens=64, eager=True)
    print(
        f"{result['cpu']} ({result['isa_class']}): bf16/fp32 decode {result['estimate']}, "
        f"prefill {result['prefill_estimate']}"
    )


if __name__ == "__main__":
    main()
