"""Batch-1 decode in bf16 against fp32, side by side: the measurement the dtype policy rests on where the CPU has
no native bf16 (service/policy/dtype.py).

  .venv/bin/python -m bench.dtype [--model PATH] [--repetitions 3] [--requests 4] [--max-tokens 64]

Both dtypes of the same model are served at once and compared in adjacent pairs (bench/paired.py); the report names
the CPU and the ISA class the policy keys on (native bf16, AVX-512 without it, AVX2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import paired
from bench.paired import REPO
from bench.stats import estimate

VARIANTS = {"bfloat16": {"SERVICE_DTYPE": "bfloat16"}, "float32": {"SERVICE_DTYPE": "float32"}}


def measure(
    model: Path,
    cache_dir: Path,
    log_dir: Path,
    repetitions: int = 3,
    requests: int = 4,
    max_tokens: int = 64,
    settings: dict[str, str] | None = None,
) -> dict:
    """bf16/fp32 per repetition in "ratios", with the CPU it ran on. Callers run it eager: with torch.compile vLLM
    warms up with a prefill of max_num_batched_tokens (2048 tokens) before it is ready, and bf16 without native
    support runs torch's reference GEMM on AVX2 (cpublas bf16_dot_with_fp32_arith: oneDNN refuses the bf16 matmul
    there), which kept the bench model's bf16 start busy for over 10 minutes (AMD EPYC Zen 1 guest, 2026-11-24)."""
    from service.facts.hardware import read_hardware
    from service.facts.software import read_software
    from service.policy.backend import choose_backend
    from service.policy.backends import BACKENDS
    from service.policy.dtype import isa_class

    cpu = read_hardware().cpu
    result = paired.measure(
        VARIANTS, model, cache_dir, log_dir, repetitions, requests, max_tokens, settings, prefill=True
    )
    return {
        **result,
        "estimate": estimate("decode bf16/fp32", "ratio", result["ratios"]).fmt(),
        "prefill_estimate": estimate("prefill bf16/fp32", "ratio", result["prefill_ratios"]).fmt(),
        "cpu": f"{cpu.vendor} {cpu.model_name} ({cpu.microarchitecture})",
        "isa_class": isa_class(cpu.isa, BACKENDS[choose_backend(cpu, read_software()).name or "avx2"]),
    }


def main() -> None:
    from bench.models import ensure_bench_model
    from service.settings import default_cache_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="default: the bench model (built on first use)")
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--compile", action="store_true", help="torch.compile (default: eager, see measure())")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "bench-dtype")
    args = ap.parse_args()
    model = args.model or ensure_bench_model(args.cache_dir)
    settings = {"kv_cache_gib": "1", "enforce_eager": "false" if args.compile else "true"}
    result = measure(
        model, args.cache_dir, args.out / "logs", args.repetitions, args.requests, args.max_tokens, settings
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dtype.json").write_text(json.dumps(result, indent=2))
    paired.print_summary(result)
    print(
        f"{result['cpu']} ({result['isa_class']}): bf16/fp32 decode {result['estimate']}, "
        f"prefill {result['prefill_estimate']}"
    )


if __name__ == "__main__":
    main()
