"""Measured speed of the quantized linear kernels: the data the quantization policy's defaults come from.

One row per (machine, format, kernel candidate), from `bench/quant_kernels.py` (vLLM's offline `LLM`, one engine per
candidate, enforce_eager, the ~0.5 B random Llama of harness/models.py quantized by round-to-nearest; decode
at batch 1 and prefill, median of repetitions with their min-max spread). Add a row set when a new machine is
measured; the policy cites what it finds here for its backend and says when nothing was measured.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    name: str
    backend: str  # the service backend it ran on
    how: str  # command, date, runs


@dataclass(frozen=True)
class Measurement:
    machine: Machine
    format: str  # "bf16", "w8a8", "w8a8-static", "w4a16" (the schemes of harness/quantized_models.py)
    kernel: str  # kernel key of service/policy/quant.py KERNELS ("bf16" for the unquantized reference)
    knobs: str  # the environment the candidate ran with
    decode_tok_s: float
    prefill_tok_s: float | None
    decode_spread: tuple[float, float] | None = None  # (min, max) over repetitions; None for a single run
    prefill_spread: tuple[float, float] | None = None

    def describe(self) -> str:
        def fmt(value: float | None, spread: tuple[float, float] | None) -> str:
            if value is None:
                return "n/a"
            return f"{value:.1f}" + (f" [{spread[0]:.1f}-{spread[1]:.1f}]" if spread else " (one run)")

        return (
            f"decode {fmt(self.decode_tok_s, self.decode_spread)} tok/s, "
            f"prefill {fmt(self.prefill_tok_s, self.prefill_spread)} tok/s"
        )


ZEN5 = Machine(
    "AMD EPYC Zen 5 KVM guest (1 compute core)",
    "zen",
    "python -m bench --quant, 2026-11-23 11:44, 3 repetitions (docs/quantization.md)",
)

EMERALD_RAPIDS_NO_AMX = Machine(
    "Intel Xeon Emerald Rapids KVM guest, AMX hidden (1 compute core)",
    "avx512",
    "python -m bench --quant, 2026-11-22 16:24, quiet machine, 3 repetitions (docs/quantization.md)",
)

ZEN4 = Machine(
    "AMD EPYC Zen 4 KVM guest (1 compute core)",
    "zen",
    "python bench/quant_kernels.py --formats bf16,w4a16 --reps 3, 2026-11-25 22:03, quiet machine",
)

ZEN4_GGML = Machine(
    "AMD EPYC Zen 4 KVM guest (1 compute core)",
    "zen",
    "python bench/quant_kernels.py --formats w4a16 --reps 3, 2026-11-26 05:23, quiet machine",
)

ZEN4_INT8 = Machine(
    "AMD EPYC Zen 4 KVM guest (1 compute core)",
    "zen",
    "python bench/quant_kernels.py --formats w8a8 --reps 3, 2026-11-26 08:17, quiet machine",
)

EMERALD_RAPIDS_NO_AMX_2 = Machine(
    "Intel Xeon Emerald Rapids KVM guest, AMX and AVX-512 BF16 hidden (1 compute core)",
    "avx512",
    "python bench/quant_kernels.py --formats bf16,fp32,w8a8,w4a16 --reps 3, 2026-11-26 22:08, quiet machine",
)

AMX_GUEST = Machine(
    "Intel Xeon KVM guest with AMX and AVX-512 BF16 (family 6 model 167 as the guest shows it; 1 compute core)",
    "amx",
    "python bench/quant_kernels.py --formats bf16,w8a8,w4a16 --reps 3, 2026-11-29 01:00, quiet machine",
)

MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement(EMERALD_RAPIDS_NO_AMX, "bf16", "bf16", "", 8.0, 71.0, (7.7, 8.7), (68.0, 72.0)),
    Measurement(EMERALD_RAPIDS_NO_AMX, "w8a8", "onednn-w8a8", "", 17.0, 291.0, (15.2, 17.3), (248.0, 314.0)),
    Measurement(EMERALD_RAPIDS_NO_AMX, "w8a8-static", "onednn-w8a8", "", 14.8, 290.0, (14.3, 14.9), (252.0, 302.0)),
    Measurement(EMERALD_RAPIDS_NO_AMX, "w4a16", "wna16-vec", "", 6.0, 58.0, (5.9, 6.4), (55.0, 60.0)),
    Measurement(
        EMERALD_RAPIDS_NO_AMX_2,
        "w8a8",
        "onednn-w8a8",
        "SERVICE_INT8_KERNEL=vllm",
        21.1,
        371.0,
        (20.7, 21.3),
        (365.0, 376.0),
    ),
    Measurement(
        EMERALD_RAPIDS_NO_AMX_2, "w8a8", "ggml-q8_0", "SERVICE_INT8_KERNEL=ggml", 13.6, 30.0, (13.1, 13.7), (30.0, 30.0)
    ),
    Measurement(
        EMERALD_RAPIDS_NO_AMX_2, "w4a16", "wna16-vec", "SERVICE_INT4_KERNEL=vllm", 7.0, 71.0, (6.9, 7.0), (71.0, 72.0)
    ),
    Measurement(
        EMERALD_RAPIDS_NO_AMX_2,
        "w4a16",
        "auto-round",
        "SERVICE_INT4_KERNEL=auto-round",
        23.7,
        307.0,
        (23.5, 23.9),
        (305.0, 308.0),
    ),
    Measurement(
        EMERALD_RAPIDS_NO_AMX_2,
        "w4a16",
        "ggml-q4_0",
        "SERVICE_INT4_KERNEL=ggml",
        19.8,
        30.0,
        (18.6, 19.9),
        (29.0, 30.0),
    ),
    Measurement(ZEN5, "bf16", "bf16", "zentorch", 26.5, 390.0, (26.0, 26.9), (388.0, 408.0)),
    Measurement(ZEN5, "w8a8", "zentorch-w8a8", "", 32.9, 565.0, (30.4, 37.6), (476.0, 632.0)),
    Measurement(
        ZEN5,
        "w8a8",
        "onednn-w8a8",
        "VLLM_DISABLED_KERNELS=ZentorchInt8ScaledMMLinearKernel",
        31.2,
        651.0,
        (29.7, 32.9),
        (464.0, 654.0),
    ),
    Measurement(ZEN5, "w8a8-static", "onednn-w8a8", "", 34.2, 632.0, (31.0, 37.9), (550.0, 654.0)),
    Measurement(ZEN5, "w4a16", "zentorch-woq", "VLLM_CPU_INT4_W4A8=0", 30.9, 405.0, (28.5, 31.0), (385.0, 410.0)),
    Measurement(ZEN5, "w4a16", "zentorch-da8w4", "VLLM_CPU_INT4_W4A8=1", 16.6, 577.0, (15.6, 19.6), (526.0, 582.0)),
    Measurement(ZEN4, "bf16", "bf16", "zentorch", 17.7, 197.0, (17.3, 17.9), (194.0, 199.0)),
    Measurement(ZEN4_GGML, "w4a16", "ggml-q4_0", "SERVICE_INT4_KERNEL=ggml", 45.4, 172.0, (44.1, 45.9), (172.0, 173.0)),
    Measurement(ZEN4_GGML, "w4a16", "zentorch-woq", "VLLM_CPU_INT4_W4A8=0", 18.7, 203.0, (17.6, 18.9), (200.0, 204.0)),
    Measurement(
        ZEN4_GGML, "w4a16", "zentorch-da8w4", "VLLM_CPU_INT4_W4A8=1", 16.0, 306.0, (15.7, 18.8), (306.0, 309.0)
    ),
    Measurement(
        ZEN4_GGML, "w4a16", "auto-round", "SERVICE_INT4_KERNEL=auto-round", 11.5, 96.0, (11.5, 11.6), (94.0, 96.0)
    ),
    Measurement(ZEN4_INT8, "w8a8", "zentorch-w8a8", "", 38.9, 350.0, (38.3, 39.0), (342.0, 352.0)),
    Measurement(
        ZEN4_INT8,
        "w8a8",
        "onednn-w8a8",
        "VLLM_DISABLED_KERNELS=ZentorchInt8ScaledMMLinearKernel",
        23.8,
        337.0,
        (23.7, 24.2),
        (327.0, 341.0),
    ),
    Measurement(ZEN4_INT8, "w8a8", "ggml-q8_0", "SERVICE_INT8_KERNEL=ggml", 30.2, 179.0, (29.3, 31.1), (178.0, 180.0)),
    Measurement(AMX_GUEST, "bf16", "bf16", "", 10.6, 630.0, (10.2, 10.6), (612.0, 646.0)),
    Measurement(AMX_GUEST, "w8a8", "amx-w8a8", "SERVICE_INT8_KERNEL=vllm", 18.9, 931.0, (18.1, 19.8), (886.0, 936.0)),
    Measurement(AMX_GUEST, "w8a8", "ggml-q8_0", "SERVICE_INT8_KERNEL=ggml", 11.5, 447.0, (11.5, 11.6), (436.0, 455.0)),
    Measurement(AMX_GUEST, "w4a16", "wna16-amx", "VLLM_CPU_INT4_W4A8=0", 7.8, 641.0, (7.3, 8.0), (631.0, 682.0)),
    Measurement(AMX_GUEST, "w4a16", "amx-w4a8", "VLLM_CPU_INT4_W4A8=1", 28.5, 575.0, (28.3, 29.1), (570.0, 598.0)),
    Measurement(
        AMX_GUEST, "w4a16", "auto-round", "SERVICE_INT4_KERNEL=auto-round", 20.0, 500.0, (19.4, 21.2), (483.0, 534.0)
    ),
    Measurement(AMX_GUEST, "w4a16", "ggml-q4_0", "SERVICE_INT4_KERNEL=ggml", 15.3, 349.0, (15.2, 15.5), (331.0, 355.0)),
)


def find(backend: str, format: str, kernel: str) -> Measurement | None:
    """The first machine's row for this backend, format and kernel."""
    return next(
        (m for m in MEASUREMENTS if m.machine.backend == backend and m.format == format and m.kernel == kernel),
        None,
    )


def cite(backend: str, format: str, kernels: tuple[str, ...]) -> str:
    """'measured on <machine> (<how>): <kernel>: <numbers>; ...' per machine that measured any of the kernels on this
    backend (machines differ: a Zen 4 and a Zen 5 are both `zen`, and only rows of one machine compare)."""
    rows = [m for m in MEASUREMENTS if m.machine.backend == backend and m.format == format and m.kernel in kernels]
    if not rows:
        return f"not measured on the {backend} backend yet (bench/quant_kernels.py measures it)"
    machines = list(dict.fromkeys(m.machine for m in rows))
    return "; ".join(
        f"measured on {machine.name} ({machine.how}): "
        + "; ".join(f"{m.kernel}: {m.describe()}" for m in rows if m.machine == machine)
        for machine in machines
    )
