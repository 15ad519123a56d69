"""The quantized linear kernels vLLM 0.32 runs on CPUs, as data: each kernel (its vLLM class, what computes, the lines
vLLM logs when it runs), the conditions a layer must meet for one, and the candidate lists in vLLM's order that the
backend registry (service/policy/backends.py) gives each backend per format family.

Mirrors vLLM's own selection (model_executor/kernels/linear/__init__.py: _POSSIBLE_INT8_KERNELS and
_POSSIBLE_KERNELS for PlatformEnum.CPU, tried in order; then each kernel's can_implement and its weight repack).
A kernel with a `provider` is the service's own: the service's vLLM plugin registers it in every vLLM process when
KERNELS_ENV names it, and vLLM tries it after its own kernels, which the policy then disables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.facts.quantization import LinearShape, QuantFacts
from service.policy.measurement_store import cite

# The format families a quantized checkpoint falls in (QuantFacts.key); every backend says for each what runs it
# or why nothing does.
FAMILIES = ("w8a8", "w4a16", "gptq-w4a16", "awq-w4a16", "fp8")
INT4_WEIGHT_ONLY = ("w4a16", "gptq-w4a16", "awq-w4a16")

# The service's kernels each vLLM process registers (class names, comma-separated), as decided at startup.
KERNELS_ENV = "SERVICE_LINEAR_KERNELS"
# vLLM 0.32's int4 weight-only and int8 kernels on CPU (_POSSIBLE_KERNELS / _POSSIBLE_INT8_KERNELS for
# PlatformEnum.CPU): disabled where the service's own runs, since vLLM tries registered kernels after these.
VLLM_INT4_KERNELS = ("Dynamic4bitLinearKernel", "ZentorchWNA16LinearKernel", "CPUWNA16LinearKernel")
VLLM_INT8_KERNELS = ("ZentorchInt8ScaledMMLinearKernel", "CPUInt8ScaledMMLinearKernel")


@dataclass(frozen=True)
class Kernel:
    vllm_class: str  # the linear kernel class vLLM selects (named in its log)
    op: str  # what computes each quantized linear layer
    log_markers: tuple[str, ...]  # lines vLLM logs when it runs this kernel (for reading the choice back)
    provider: str | None = None  # the service module that hands it to vLLM (None: vLLM's own)
    # Bytes per 32 weights, scales included, as the kernel holds a checkpoint's layers (None: as the file stores them)
    block_bytes: int | None = None


KERNELS: dict[str, Kernel] = {
    "zentorch-w8a8": Kernel(
        "ZentorchInt8ScaledMMLinearKernel",
        "zentorch_dynamic_qlinear: int8 x int8 GEMM, activations quantized per token at run time",
        ("Selected ZentorchInt8ScaledMMLinearKernel", "[zen_cpu] Using zentorch_dynamic_qlinear for W8A8"),
    ),
    "onednn-w8a8": Kernel(
        "CPUInt8ScaledMMLinearKernel",
        "oneDNN int8 GEMM (onednn_scaled_mm) with vLLM's per-token activation quantization",
        ("Selected CPUInt8ScaledMMLinearKernel",),
    ),
    "amx-w8a8": Kernel(
        "CPUInt8ScaledMMLinearKernel",
        "AMX int8 GEMM (int8_scaled_mm_with_quant, vLLM's sgl kernel; quantizes activations per token itself)",
        ("Selected CPUInt8ScaledMMLinearKernel",),
    ),
    "zentorch-da8w4": Kernel(
        "ZentorchWNA16LinearKernel",
        "zentorch_dynamic_qlinear DA8W4: int4 weights x int8 dynamically quantized activations",
        ("Using ZentorchWNA16LinearKernel", "[zen_cpu] Using zentorch_dynamic_qlinear for DA8W4"),
    ),
    "zentorch-woq": Kernel(
        "ZentorchWNA16LinearKernel",
        "zentorch_woq_linear: int4 weights dequantized in the GEMM, bf16 activations (weight-only)",
        ("Using ZentorchWNA16LinearKernel", "[zen_cpu] Using zentorch_woq_linear for W4A16"),
    ),
    "zentorch-wna16-fallback": Kernel(
        "ZentorchWNA16LinearKernel",
        "cpu_gemm_wna16 (vLLM's generic int4 kernel): zentorch's int4 paths read only the compressed-tensors layout",
        ("Using ZentorchWNA16LinearKernel", "falling back to CPUWNA16LinearKernel"),
    ),
    "amx-w4a8": Kernel(
        "CPUWNA16LinearKernel",
        "int4_scaled_mm_cpu (AMX W4A8): int4 weights repacked to the AWQ layout x int8 activations",
        ("Using CPUWNA16LinearKernel",),
    ),
    "wna16-amx": Kernel(
        "CPUWNA16LinearKernel",
        "cpu_gemm_wna16 isa=amx: int4 weights, bf16 activations",
        ("Using CPUWNA16LinearKernel",),
    ),
    "wna16-vec": Kernel(
        "CPUWNA16LinearKernel",
        "cpu_gemm_wna16 isa=vec (AVX-512): int4 weights, 16-bit activations",
        ("Using CPUWNA16LinearKernel",),
    ),
    "auto-round": Kernel(
        "ArkWNA16LinearKernel",
        "auto-round-lib's woqgemm (Intel's prebuilt JIT kernels for AVX2, AVX-512 and AMX): int4 weights repacked "
        "once at load, fp32 compute",
        ("Using ArkWNA16LinearKernel",),
        provider="service.kernels.ark_wna16",
    ),
    "ggml-q4_0": Kernel(
        "GgmlLinearKernel",
        "ggml's Q4_0 matmul (llama.cpp's CPU kernels, repacked 8x8 for AVX2 / AVX-512 at load): symmetric int4 "
        "weights x activations quantized per 32-block to int8",
        ("Using GgmlLinearKernel",),
        provider="service.kernels.ggml_linear",
        block_bytes=18,  # Q4_0: an fp16 scale and 16 nibble bytes
    ),
    "ggml-q4_1": Kernel(
        "GgmlLinearKernel",
        "ggml's repacked Q4_0 matmul (llama.cpp's CPU kernels, 8x8 for AVX2 / AVX-512) plus each 32-block's fp32 "
        "offset: int4 weights with zero points, held as Q4_0 without loss, x activations quantized per 32-block to int8 "
        "(ggml's Q4_1 matmul on the blocks as they are where a layer's rows do not repack in eights or an offset is "
        "not exact in fp32)",
        ("Using GgmlLinearKernel",),
        provider="service.kernels.ggml_linear",
        block_bytes=22,  # repacked Q4_0 plus an fp32 offset
    ),
    "ggml-q8_0": Kernel(
        "GgmlInt8LinearKernel",
        "ggml's Q8_0 matmul (llama.cpp's CPU kernels): int8 weights as stored x activations quantized per 32-block to "
        "int8 at run time (a checkpoint's static activation scales go unused)",
        ("Selected GgmlInt8LinearKernel",),
        provider="service.kernels.ggml_int8",
        block_bytes=34,  # Q8_0: an fp16 scale and 32 int8 values
    ),
    "ggml-gguf": Kernel(
        "GgufBlocksLinearMethod",
        "ggml's matmul on a GGUF file's own blocks (llama.cpp's CPU kernels for their type): the linear layers' "
        "weights as the file stores them x activations quantized by ggml for that type",
        ("[service] GGUF blocks:",),
        provider="service.kernels.gguf_blocks",
    ),
    "bf16-weights": Kernel(
        "Bf16WeightsLinear",
        "the service's bf16-weight kernel for unquantized linear layers on a CPU without native bf16 (weights "
        "bf16 in memory, widened to fp32; a GEMV, then fp32 GEMM on widened chunks from 8 rows in an fp32 engine, "
        "16 in a bf16 one)",
        ("[service] bf16 weights:",),
        provider="service.kernels.bf16_linear",
    ),
    "amx-fp8": Kernel(
        "CPUFP8W8A8ScaledMMLinearKernel",
        "AMX fp8 GEMM (fp8_scaled_mm_cpu)",
        ("CPUFP8W8A8ScaledMMLinearKernel",),
    ),
    "torch-fp8": Kernel(
        "ChannelWiseTorchFP8ScaledMMLinearKernel",
        "torch._scaled_mm on the CPU (a generic reference path, not an optimised kernel)",
        ("TorchFP8ScaledMMLinearKernel",),
    ),
}


@dataclass(frozen=True)
class Layer:
    """What one linear layer's kernel choice depends on."""

    facts: QuantFacts
    shape: LinearShape | None  # None when the model's layer shapes are unknown (not checked)
    dtype: str  # activation dtype (the engine dtype)
    int4_w4a8: bool  # VLLM_CPU_INT4_W4A8 as the engine will see it
    zentorch_w8a8: bool  # ZentorchInt8ScaledMMLinearKernel not disabled

    @property
    def group(self) -> int | None:
        """Input channels per scale (K for per-channel weights)."""
        if self.facts.group_size:
            return self.facts.group_size
        return self.shape.in_features if self.shape else None


def ark_shape_fits(in_features: int, out_features: int, group: int) -> tuple[bool, str | None]:
    """auto-round-lib's blob takes whole groups, input sizes in 32s and output sizes in 8s (int32 words of 4-bit
    values); it does not check, so both the policy and the kernel do."""
    if in_features % group or in_features % 32 or out_features % 8:
        return False, (
            f"layer {in_features}x{out_features} with groups of {group}: auto-round-lib needs an input size that is "
            "a multiple of 32 and of the group size, and an output size that is a multiple of 8"
        )
    return True, None


def _shape(check: Callable[[Layer, LinearShape], bool]) -> Callable[[Layer], bool]:
    return lambda c: c.shape is None or check(c, c.shape)


# condition -> (holds?, what it needs, as said when it does not hold)
CONDITIONS: dict[str, tuple[Callable[[Layer], bool], str]] = {
    "zentorch_w8a8": (lambda c: c.zentorch_w8a8, "ZentorchInt8ScaledMMLinearKernel not disabled (w8a8_zentorch)"),
    "dynamic_acts": (lambda c: c.facts.activation_scheme == "dynamic", "dynamic (per-token) activation scales"),
    "symmetric_acts": (lambda c: c.facts.activation_symmetric is not False, "symmetric activation quantization"),
    "channel_weights": (lambda c: c.facts.weight_strategy == "channel", "per-channel weight scales"),
    "int4_w4a8": (lambda c: c.int4_w4a8, "VLLM_CPU_INT4_W4A8=1"),
    "bf16_acts": (lambda c: c.dtype == "bfloat16", "bf16 activations"),
    "symmetric_weights": (lambda c: c.facts.weight_symmetric, "symmetric int4 weights (no zero points)"),
    "ct_layout": (lambda c: c.facts.method == "compressed-tensors", "the compressed-tensors pack layout"),
    "zentorch_group": (
        _shape(lambda c, s: c.facts.group_size is None or s.in_features % c.facts.group_size == 0),
        "a group size that divides the layer's input size",
    ),
    "da8w4_group": (_shape(lambda c, s: (c.group or 0) % 4 == 0), "a group size that is a multiple of 4"),
    "wna16_shape": (
        _shape(lambda c, s: s.in_features % 32 == 0 and s.out_features % 32 == 0 and (c.group or 0) % 2 == 0),
        "input and output sizes that are multiples of 32 and an even group size",
    ),
    "ark_shape": (
        _shape(lambda c, s: ark_shape_fits(s.in_features, s.out_features, c.group or s.in_features)[0]),
        "an input size that is a multiple of 32 and of the group size, and an output size that is a multiple of 8",
    ),
    "ggml_blocks": (
        _shape(lambda c, s: s.in_features % 32 == 0 and (c.group or 0) % 32 == 0),
        "an input size and a group size that are multiples of ggml's 32-wide blocks",
    ),
    "amx_int8_shape": (
        _shape(lambda c, s: s.in_features % 32 == 0 and s.out_features % 16 == 0),
        "input size a multiple of 32 and output size a multiple of 16",
    ),
}


@dataclass(frozen=True)
class Rule:
    needs: tuple[str, ...]
    kernel: str


# Candidates in vLLM's order; the first whose conditions hold runs.
W8A8_GENERIC = (Rule((), "onednn-w8a8"),)
WNA16_VEC = (Rule(("wna16_shape",), "wna16-vec"),)
WNA16_AMX = (Rule(("wna16_shape", "int4_w4a8", "bf16_acts"), "amx-w4a8"), Rule(("wna16_shape",), "wna16-amx"))
ZEN_GPTQ_AWQ = (
    Rule(("zentorch_group", "wna16_shape"), "zentorch-wna16-fallback"),
    Rule(("wna16_shape",), "wna16-vec"),
)
W8A8_ZEN = (
    Rule(("zentorch_w8a8", "dynamic_acts", "symmetric_acts", "channel_weights"), "zentorch-w8a8"),
    Rule((), "onednn-w8a8"),
)
W8A8_AMX = (Rule(("symmetric_acts", "amx_int8_shape"), "amx-w8a8"), Rule((), "onednn-w8a8"))
W4A16_ZEN = (
    Rule(("zentorch_group", "int4_w4a8", "bf16_acts", "symmetric_weights", "da8w4_group"), "zentorch-da8w4"),
    Rule(("zentorch_group",), "zentorch-woq"),
    Rule(("wna16_shape",), "wna16-vec"),
)
# The service's kernels: each runs alone, vLLM's kernels of the family are disabled.
AUTO_ROUND = (Rule(("ark_shape",), "auto-round"),)
GGML = (Rule(("ggml_blocks", "symmetric_weights"), "ggml-q4_0"), Rule(("ggml_blocks",), "ggml-q4_1"))
GGML_INT8 = (Rule(("ggml_blocks",), "ggml-q8_0"),)
# The values of int4_kernel / int8_kernel that name the service's kernels: what must be installed for each.
OURS = {"auto-round": "auto-round-lib (the service depends on it)", "ggml": "the service's ggml kernel (make kernels)"}


@dataclass(frozen=True)
class Handover:
    """Format families whose linear layers the service's own kernels may run instead of vLLM's: the setting (and
    Backend field) that says whose, the service's kernels it can name with their candidates, and vLLM's kernels that
    step aside for them."""

    setting: str
    kind: str  # what the kernels are called in reasons
    measured_as: str  # the format of quant_measurements.py whose rows the backend's default cites
    families: tuple[str, ...]
    ours: dict[str, tuple[Rule, ...]]
    vllm_kernels: tuple[str, ...]


INT4_HANDOVER = Handover(
    "int4_kernel", "int4", "w4a16", INT4_WEIGHT_ONLY, {"auto-round": AUTO_ROUND, "ggml": GGML}, VLLM_INT4_KERNELS
)
INT8_HANDOVER = Handover("int8_kernel", "int8", "w8a8", ("w8a8",), {"ggml": GGML_INT8}, VLLM_INT8_KERNELS)
HANDOVERS = (INT4_HANDOVER, INT8_HANDOVER)
FP8_AMX = (Rule((), "amx-fp8"),)
FP8_TORCH = (Rule((), "torch-fp8"),)


# Kernels whose answers are off on a CPU whose int8 dot products do not accumulate in int32 (Isa.vnni): a warning
# where one runs, and the policy's defaults and the calibration pass them over. Measured (docs/quantization.md): on
# full-range random int8 weights onednn_scaled_mm was up to 16% off an exact int32 product with oneDNN held to AVX2 or
# AVX-512 without VNNI, and exact with weights in [-63, 63] or with VNNI; the default model's W8A8 copy on an AMD EPYC
# Zen 2 guest (docs/quality.md).
SATURATES_WITHOUT_VNNI: dict[str, str] = {
    "onednn-w8a8": "vLLM's oneDNN int8 GEMM on a CPU without VNNI (AVX-512 VNNI, AVX-VNNI or AMX int8) multiplies "
    "through vpmaddubsw, whose pair sums saturate at int16 on full-range int8 weights: its answers are off ("
    + cite("claim/onednn-int8-saturates/zen2")
    + "); the service's ggml kernel (int8_kernel=ggml) computes int8 exactly here",
}

# Kernels that run but are a fallback the user should know about (a warning, not a refusal).
FALLBACK_WARNINGS: dict[str, str] = {
    "torch-fp8": "fp8 checkpoint without AMX: vLLM 0.32 has no optimised fp8 CPU kernel here and falls back to "
    "torch._scaled_mm (unmeasured, expect it slow); an int8 (W8A8) or int4 (W4A16) copy runs on tuned kernels",
    "zentorch-wna16-fallback": "GPTQ/AWQ layout on Zen: zentorch's int4 kernels take only compressed-tensors "
    "checkpoints, so vLLM's generic cpu_gemm_wna16 runs; a compressed-tensors W4A16 copy of the model runs "
    "zentorch_woq_linear",
}
