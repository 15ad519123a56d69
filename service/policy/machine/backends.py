"""The CPU backends, best first: one entry per family, and every policy reads its part from the entry.

An entry holds whether the machine can run it (its check), the vLLM platform class it runs on and the kernel build
that computes, what those kernels can run (service/facts/vllm_kernel_limits.py), its quantized linear kernels per format family
(service/policy/linear/kernel_candidates.py) or why it has none, the defaults of the knobs that steer them, its OpenMP runtime,
how it computes bf16 where the CPU has no native bf16 (the dtype policy's measurement key), the backends the user may
ask for instead on a CPU where it is best, and the decisions only it makes. Adding a family is one entry here (plus
its facts, if the CPU readers do not know it yet); tests/unit/policy/test_backends.py fails where an entry leaves a table
unanswered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from service.facts.cpu import CpuInfo
from service.facts.software import SoftwareFacts
from service.facts.vllm_kernel_limits import AMX, X86, ZEN, BackendKernels
from service.measurements.store import cite
from service.policy.linear.ggml_handover import BF16_AMX, BF16_AVX512, BF16_ZEN4, FP32_AVX512, FP32_ZEN2, GgmlHandover
from service.policy.linear.kernel_candidates import (
    FP8_AMX,
    FP8_TORCH,
    W4A16_ZEN,
    W8A8_AMX,
    W8A8_GENERIC,
    W8A8_ZEN,
    WNA16_AMX,
    WNA16_VEC,
    ZEN_GPTQ_AWQ,
    Rule,
)
from service.policy.plan.decision import PolicyResult, Source, env
from service.settings import Settings

Check = Callable[[CpuInfo, SoftwareFacts], tuple[bool, str]]
# Decisions a backend alone makes, from the settings and the names the user set.
Decide = Callable[[Settings, frozenset[str]], PolicyResult]

ZEN_PLATFORM = "vllm.platforms.zen_cpu.ZenCpuPlatform"
GENERIC_PLATFORM = "vllm.platforms.cpu.CpuPlatform"

# vLLM 0.32's AVX2 kernel build (_C_AVX2, loaded on CPUs without AVX-512) lacks the op of its only x86 int4 kernel.
_NO_INT4_IN_AVX2 = (
    "vLLM 0.32's only x86 int4 kernel (CPUWNA16LinearKernel, op cpu_gemm_wna16) is not in its AVX2 kernel build "
    "(_C_AVX2, loaded on CPUs without AVX-512): the engine would die at the first forward pass; serve the "
    "unquantized model or a W8A8 copy (oneDNN int8 runs on AVX2)"
)


@dataclass(frozen=True)
class Int4Default:
    """VLLM_CPU_INT4_W4A8 where the backend reads it: int8 activations for int4 weights, or weight-only."""

    value: bool
    methods: frozenset[str]  # checkpoint formats whose int4 path reads the knob
    why: str  # where the default comes from (a measurement key: (backend, format, kernels) cited by the policy)
    measured: tuple[str, ...]  # the kernels whose measurements the reason cites


@dataclass(frozen=True)
class KernelOrder:
    """Whose kernel runs a family the service has kernels for (int4 weight-only, W8A8) unless the user says
    (int4_kernel, int8_kernel): the first of `kernels` that is installed ("vllm": vLLM's own; "ggml", "auto-round":
    the service's)."""

    kernels: tuple[str, ...]
    why: str
    measured: tuple[str, ...] = ()  # the kernels whose measurements on this backend the reason cites


# Measured on an AMX guest (the quant rows of service/measurements/ the reason cites).
AMX_INT4 = KernelOrder(
    ("vllm",),
    "vLLM's AMX W4A8 kernel by default: it decoded and prefilled faster than auto-round-lib's and the service's ggml "
    "kernel on an AMX CPU",
    ("amx-w4a8", "auto-round", "ggml-q4_0"),
)
# Measured on an Intel Emerald Rapids guest without AMX or AVX-512 BF16 (the quant rows the reason cites).
AVX512_INT4 = KernelOrder(
    ("auto-round", "ggml", "vllm"),
    "auto-round-lib's kernel by default: it decoded and prefilled faster than the service's ggml kernel and vLLM's "
    "cpu_gemm_wna16 on AVX-512 without AMX",
    ("auto-round", "ggml-q4_0", "wna16-vec"),
)
# ggml's int8 kernel prefills at the activation dtype's GEMM speed (it dequantizes for batches), vLLM's at int8 GEMM
# speed: about half on a Zen 4 (docs/quantization.md), so it must win decode by much to be a default.
VLLM_INT8 = KernelOrder(
    ("vllm",),
    "vLLM's int8 kernels by default: they prefill through int8 GEMMs, the service's ggml kernel through the "
    "dtype's GEMM after dequantizing",
    ("ggml-q8_0",),
)


@dataclass(frozen=True)
class Backend:
    name: str
    check: Check
    platform: str  # the vLLM platform class, which the service's platform plugin returns in every vLLM process
    platform_imports: tuple[str, ...]  # modules whose import registers the platform's kernels (zentorch's ops)
    computes_with: str  # what computes: said in the platform decision
    kernels: BackendKernels
    # format family (kernels/registry.py FAMILIES) -> the candidates in vLLM's order, or why this backend runs none
    quant: Mapping[str, tuple[Rule, ...] | str]
    openmp: Literal["intel", "gnu"]  # the OpenMP runtime its kernels are built against (the preload policy)
    dtype_class: str  # how bf16 is computed where the CPU lacks native bf16: the dtype measurements' key
    # Activation dtype -> where the service's ggml kernels hand a batch to the GEMM (ggml_handover.py): the table
    # measured on the GEMM nearest to this backend's
    ggml_handover: Mapping[str, GgmlHandover]
    int4_w4a8: Int4Default | None = None
    int4_kernel: KernelOrder = KernelOrder(("vllm",), "vLLM's int4 kernels by default")
    int8_kernel: KernelOrder = VLLM_INT8
    w8a8_zentorch: bool = False  # W8A8 runs zentorch_dynamic_qlinear unless the user turns it off
    lowers_to: tuple[str, ...] = ()  # backends the user may request instead where this one is best
    decide: Decide | None = None
    quant_note: str = ""  # said with every quantized model's kernel decision
    # Unquantized models computed in fp32: why the service's bf16-weight kernel runs them by default ("": it does not)
    bf16_weights: str = ""
    # Unquantized models computed in bf16 on a CPU without native bf16: the same, for the service's kernel
    bf16_engine: str = ""

    @property
    def generic(self) -> bool:
        return self.platform == GENERIC_PLATFORM


def _zen(cpu: CpuInfo, sw: SoftwareFacts) -> tuple[bool, str]:
    if cpu.vendor != "AuthenticAMD":
        return False, f"Zen acceleration (zentorch) needs an AMD CPU; this one is {cpu.vendor}"
    if not cpu.isa.avx512:
        return False, f"Zen acceleration needs AVX-512 (Zen 4 or later); {cpu.microarchitecture} has none"
    if not sw.zentorch_usable:
        return False, f"AMD {cpu.microarchitecture} with AVX-512, but {sw.zentorch_reason}"
    return True, f"AMD {cpu.microarchitecture} with AVX-512 and {sw.zentorch_reason}: vLLM uses ZenCpuPlatform"


def _amx(cpu: CpuInfo, sw: SoftwareFacts) -> tuple[bool, str]:
    if not cpu.isa.amx:
        return False, "no AMX (amx_tile and amx_bf16 not both in the CPU flags)"
    # vLLM loads its AMX kernel build (_C) only where torch finds AVX-512 and AVX-512 BF16; else _C_AVX512 or _AVX2.
    if not (cpu.isa.avx512 and cpu.isa.avx512_bf16):
        return (
            False,
            f"{cpu.microarchitecture} shows AMX without AVX-512 BF16: vLLM loads its AMX kernels only with both",
        )
    return True, f"{cpu.microarchitecture} has AMX (amx_tile + amx_bf16): vLLM's AMX/AVX-512 BF16 kernels"


def _avx512(cpu: CpuInfo, sw: SoftwareFacts) -> tuple[bool, str]:
    if cpu.isa.avx512:
        bf16 = "with" if cpu.isa.avx512_bf16 else "without"
        return True, f"{cpu.microarchitecture} has AVX-512 ({bf16} AVX-512 BF16): vLLM's AVX-512 kernels"
    return False, _NO_AVX512


# What torch asks for before vLLM loads its AVX-512 kernels (torch.cpu._is_avx512_supported)
_NO_AVX512 = "no AVX-512 F, BW, DQ and VL together in the CPU flags (torch and vLLM need all four)"


def _avx2(cpu: CpuInfo, sw: SoftwareFacts) -> tuple[bool, str]:
    if cpu.isa.avx2:
        partial = " (AVX-512F alone: torch and vLLM need F, BW, DQ and VL)" if "avx512f" in cpu.flags else ""
        return True, f"{cpu.microarchitecture} has AVX2 but no AVX-512{partial}: vLLM's AVX2 kernels"
    return False, "no AVX2: vLLM's CPU kernels need at least AVX2 and would die with SIGILL"


def _zentorch_prepack(settings: Settings, user: frozenset[str]) -> PolicyResult:
    source: Source = "user" if "zentorch_weight_prepack" in user else "default"
    value = "1" if settings.zentorch_weight_prepack else "0"
    why = "zentorch prepacks linear weights once at load into its blocked layout (faster GEMMs, slower load)"
    return PolicyResult.of(
        env("VLLM_ZENTORCH_WEIGHT_PREPACK", value, why if value == "1" else "turned off by the user", source)
    )


_GENERIC_QUANT: Mapping[str, tuple[Rule, ...] | str] = {
    "w8a8": W8A8_GENERIC,
    "w4a16": WNA16_VEC,
    "gptq-w4a16": WNA16_VEC,
    "awq-w4a16": WNA16_VEC,
    "fp8": FP8_TORCH,
}

BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "zen",
            _zen,
            ZEN_PLATFORM,
            ("zentorch",),
            "zentorch's kernels",
            ZEN,
            {
                "w8a8": W8A8_ZEN,
                "w4a16": W4A16_ZEN,
                "gptq-w4a16": ZEN_GPTQ_AWQ,
                "awq-w4a16": ZEN_GPTQ_AWQ,
                "fp8": FP8_TORCH,
            },
            openmp="gnu",
            dtype_class="avx512",
            # Zen 4's fp32 FMA datapath is 256 bits wide, as Zen 2's: its fp32 GEMM is nearer the AVX2 one measured
            ggml_handover={"bfloat16": BF16_ZEN4, "float32": FP32_ZEN2},
            int4_w4a8=Int4Default(
                False,
                frozenset({"compressed-tensors"}),
                "Zen int4 default: weight-only zentorch_woq_linear, not DA8W4 (vLLM's default)",
                ("zentorch-woq", "zentorch-da8w4", "wna16-vec"),
            ),
            w8a8_zentorch=True,
            int4_kernel=KernelOrder(
                ("ggml", "vllm"),
                "the service's ggml kernel (llama.cpp's Q4_0 GEMV) by default: it decoded faster than zentorch's "
                "weight-only kernel and the service's auto-round-lib one",
                ("ggml-q4_0", "zentorch-woq", "auto-round"),
            ),
            lowers_to=("avx512",),
            decide=_zentorch_prepack,
            quant_note="VLLM_ZENTORCH_WEIGHT_PREPACK applies to the unquantized layers; quantized ones are repacked "
            "by their kernel at load",
        ),
        Backend(
            "amx",
            _amx,
            GENERIC_PLATFORM,
            (),
            "the kernel build vLLM picks from the CPU (_C: AMX and AVX-512 BF16)",
            AMX,
            {"w8a8": W8A8_AMX, "w4a16": WNA16_AMX, "gptq-w4a16": WNA16_AMX, "awq-w4a16": WNA16_AMX, "fp8": FP8_AMX},
            openmp="intel",
            dtype_class="avx512",
            ggml_handover={"bfloat16": BF16_AMX, "float32": FP32_AVX512},
            int4_w4a8=Int4Default(
                True,
                frozenset({"compressed-tensors", "gptq", "awq"}),
                "vLLM's default (AMX W4A8 for bf16 activations): it decoded faster than the weight-only cpu_gemm_wna16",
                ("amx-w4a8", "wna16-amx"),
            ),
            int4_kernel=AMX_INT4,
        ),
        Backend(
            "avx512",
            _avx512,
            GENERIC_PLATFORM,
            (),
            "the kernel build vLLM picks from the CPU (_C with AVX-512 BF16, else _C_AVX512)",
            X86,
            _GENERIC_QUANT,
            openmp="intel",
            dtype_class="avx512",
            ggml_handover={"bfloat16": BF16_AVX512, "float32": FP32_AVX512},
            int4_kernel=AVX512_INT4,
            bf16_weights="on AVX-512 without its bf16 extension, where the service computes in fp32, linear weights "
            "that are bf16 values stay bf16 (half the bytes a decode step reads), widened to fp32 in registers by the "
            "service's kernel: " + cite("claim/bf16-weights-engine/emeraldrapids"),
            bf16_engine="on AVX-512 without its bf16 extension vLLM's bf16 GEMM converts bf16 in software; the "
            "service's kernel widens the bf16 weights and activations and sums in fp32: "
            + cite("claim/bf16-engine-kernel/emeraldrapids"),
        ),
        Backend(
            "avx2",
            _avx2,
            GENERIC_PLATFORM,
            (),
            "the kernel build vLLM picks from the CPU (_C_AVX2)",
            X86,
            {
                **_GENERIC_QUANT,
                "w4a16": _NO_INT4_IN_AVX2,
                "gptq-w4a16": _NO_INT4_IN_AVX2,
                "awq-w4a16": _NO_INT4_IN_AVX2,
            },
            openmp="intel",
            dtype_class="avx2",
            ggml_handover={
                "bfloat16": BF16_ZEN4,
                "float32": FP32_ZEN2,
            },  # bf16 here only where the user asks: not measured
            int4_kernel=KernelOrder(
                ("ggml", "auto-round"),
                "vLLM has no int4 kernel in its AVX2 build (_C_AVX2 lacks cpu_gemm_wna16): the service's ggml kernel ("
                + cite("claim/int4-ggml-read/zen2")
                + "), else auto-round-lib's",
            ),
            bf16_weights="on AVX2, where the service computes in fp32, linear weights that are bf16 values stay bf16 "
            "(half the bytes a decode step reads), widened to fp32 in registers by the service's kernel: "
            + cite("claim/bf16-weights-gemv/avx2")
            + "; "
            + cite("claim/bf16-weights-engine/zen4"),
            int8_kernel=KernelOrder(
                ("ggml", "vllm"),
                "the service's ggml kernel (llama.cpp's Q8_0 dot products) by default: "
                + cite("claim/int8-onednn-avx2/zen3")
                + "; "
                + cite("claim/int8-ggml-read/zen2"),
            ),
        ),
    )
}

ORDER = tuple(BACKENDS)  # best first


def by_platform(qualname: str) -> Backend | None:
    """The first backend that runs on this vLLM platform class (the platform plugin's view)."""
    return next((b for b in BACKENDS.values() if b.platform == qualname), None)
