"""The quantized linear kernels vLLM 0.32 runs on CPUs, as data: each kernel (its vLLM class, what computes, the lines
vLLM logs when it runs), the conditions a layer must meet for one, and the candidate lists in vLLM's order that the
backend registry (service/policy/machine/backends.py) gives each backend per format family.

Mirrors vLLM's own selection (model_executor/kernels/linear/__init__.py: _POSSIBLE_INT8_KERNELS and
_POSSIBLE_KERNELS for PlatformEnum.CPU, tried in order; then each kernel's can_implement and its weight repack).
A kernel with a `provider` is the service's own: the service's vLLM plugin registers it in every vLLM process when
KERNELS_ENV names it, and vLLM tries it after its own kernels, which the policy then disables.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.kernels.registry import INT4_WEIGHT_ONLY, KERNELS
from service.measurements.store import cite

# vLLM 0.32's int4 weight-only and int8 kernels on CPU (_POSSIBLE_KERNELS / _POSSIBLE_INT8_KERNELS for
# PlatformEnum.CPU): disabled where the service's own runs, since vLLM tries registered kernels after these.
VLLM_INT4_KERNELS = ("Dynamic4bitLinearKernel", "ZentorchWNA16LinearKernel", "CPUWNA16LinearKernel")
VLLM_INT8_KERNELS = ("ZentorchInt8ScaledMMLinearKernel", "CPUInt8ScaledMMLinearKernel")


@dataclass(frozen=True)
class Rule:
    """One candidate of a list in vLLM's order: a registry kernel, taken where its conditions hold."""

    kernel: str

    @property
    def needs(self) -> tuple[str, ...]:
        return KERNELS[self.kernel].needs


# Candidates in vLLM's order; the first whose conditions hold runs.
W8A8_GENERIC = (Rule("onednn-w8a8"),)
WNA16_VEC = (Rule("wna16-vec"),)
WNA16_AMX = (Rule("amx-w4a8"), Rule("wna16-amx"))
ZEN_GPTQ_AWQ = (
    Rule("zentorch-wna16-fallback"),
    Rule("wna16-vec"),
)
W8A8_ZEN = (
    Rule("zentorch-w8a8"),
    Rule("onednn-w8a8"),
)
W8A8_AMX = (Rule("amx-w8a8"), Rule("onednn-w8a8"))
W4A16_ZEN = (
    Rule("zentorch-da8w4"),
    Rule("zentorch-woq"),
    Rule("wna16-vec"),
)
# The values of int4_kernel / int8_kernel that name the service's kernels: what must be installed for each.
OURS = {k.chosen_by: k.requires or "" for k in KERNELS.values() if k.chosen_by}


def ours(families: tuple[str, ...]) -> dict[str, tuple[Rule, ...]]:
    """The service's kernels for these format families, per setting value, in the registry's order: each runs alone,
    vLLM's kernels of the family are disabled."""
    rules: dict[str, tuple[Rule, ...]] = {}
    for name, kernel in KERNELS.items():
        if kernel.chosen_by and set(kernel.formats) <= set(families):
            rules[kernel.chosen_by] = (*rules.get(kernel.chosen_by, ()), Rule(name))
    return rules


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


INT4_HANDOVER = Handover("int4_kernel", "int4", "w4a16", INT4_WEIGHT_ONLY, ours(INT4_WEIGHT_ONLY), VLLM_INT4_KERNELS)
INT8_HANDOVER = Handover("int8_kernel", "int8", "w8a8", ("w8a8",), ours(("w8a8",)), VLLM_INT8_KERNELS)
HANDOVERS = (INT4_HANDOVER, INT8_HANDOVER)
FP8_AMX = (Rule("amx-fp8"),)
FP8_TORCH = (Rule("torch-fp8"),)


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
