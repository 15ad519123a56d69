"""The kernel registry: every linear kernel vLLM 0.32 runs on CPUs and every one the service hands it, as data.

Each entry declares the vLLM class it implements (named in vLLM's log), what computes, the formats it takes, the
bytes per 32 weights it holds, the conditions a layer must meet for it (`can_implement`, mirroring vLLM's
model_executor/kernels/linear), and the measurement-store keys its claims rest on. An entry with a `provider` is the
service's own kernel: that module's `register()` hands it to vLLM in every vLLM process where KERNELS_ENV names it.
The policy (policy/linear/kernel_candidates.py, policy/machine/backends.py) reads the registry to decide which kernel runs where;
nothing here decides.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from service.facts.quantization import LinearShape, QuantFacts

# The format families a quantized checkpoint falls in (QuantFacts.key).
FAMILIES = ("w8a8", "w4a16", "gptq-w4a16", "awq-w4a16", "fp8")
INT4_WEIGHT_ONLY = ("w4a16", "gptq-w4a16", "awq-w4a16")
# What else a kernel may take: a GGUF file's own blocks, or unquantized ("dense") linear layers.
FORMATS = (*FAMILIES, "gguf", "dense")

# The service's kernels each vLLM process registers (class names, comma-separated), as decided at startup.
# A GGUF file's converted checkpoint names this quantization method (quantization_config.quant_method); the
# gguf_blocks kernel registers it with vLLM.
BLOCKS_METHOD = "service_gguf"
# Where the ggml kernels hand a batch to torch's GEMM, per activation dtype and ggml type (policy/linear/ggml_handover.py).


def handover_env(tables: Mapping[str, Mapping[str, int]]) -> str:
    """activation dtype -> ggml type -> rows, as HANDOVER_ENV carries it."""
    return json.dumps({d: dict(rows) for d, rows in tables.items()}, sort_keys=True, separators=(",", ":"))


def parse_handover(value: str) -> dict[str, dict[str, int]]:
    return {str(d): {str(t): int(n) for t, n in rows.items()} for d, rows in json.loads(value).items()}


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
class Kernel:
    vllm_class: str  # the linear kernel class vLLM selects (named in its log)
    op: str  # what computes each quantized linear layer
    log_markers: tuple[str, ...]  # lines vLLM logs when it runs this kernel (for reading the choice back)
    provider: str | None = None  # the service module that hands it to vLLM (None: vLLM's own)
    # Bytes per 32 weights, scales included, as the kernel holds a checkpoint's layers (None: as the file stores them)
    block_bytes: int | None = None
    formats: tuple[str, ...] = ()  # what it takes: quantized families (FAMILIES), "gguf" blocks, "dense" layers
    needs: tuple[str, ...] = ()  # the CONDITIONS a layer must meet for it (vLLM's can_implement, as data)
    cites: tuple[str, ...] = ()  # measurement-store keys its claims rest on (rows naming it as `kernel` count too)
    # The service's own kernels a setting chooses: the int4_kernel / int8_kernel value that names it (kernels of one
    # value are tried in this registry's order), and what must be installed for it.
    chosen_by: str | None = None
    requires: str | None = None
    # Runs ggml's matmul op, which hands batches from SERVICE_GGML_HANDOVER's rows on to the dtype's GEMM: the
    # policy decides that table wherever such a kernel is planned (service/policy/linear/ggml_handover.py).
    ggml_op: bool = False

    def can_implement(self, layer: Layer) -> tuple[bool, str | None]:
        """Whether this kernel takes `layer`, and if not what it needs (as vLLM's can_implement would refuse)."""
        missing = [CONDITIONS[n][1] for n in self.needs if not CONDITIONS[n][0](layer)]
        return (False, ", ".join(missing)) if missing else (True, None)


KERNELS: dict[str, Kernel] = {
    "zentorch-w8a8": Kernel(
        "ZentorchInt8ScaledMMLinearKernel",
        "zentorch_dynamic_qlinear: int8 x int8 GEMM, activations quantized per token at run time",
        ("Selected ZentorchInt8ScaledMMLinearKernel", "[zen_cpu] Using zentorch_dynamic_qlinear for W8A8"),
        formats=("w8a8",),
        needs=("zentorch_w8a8", "dynamic_acts", "symmetric_acts", "channel_weights"),
    ),
    "onednn-w8a8": Kernel(
        "CPUInt8ScaledMMLinearKernel",
        "oneDNN int8 GEMM (onednn_scaled_mm) with vLLM's per-token activation quantization",
        ("Selected CPUInt8ScaledMMLinearKernel",),
        formats=("w8a8",),
        needs=(),
        cites=("claim/onednn-int8-saturates/zen2", "claim/int8-onednn-avx2/zen3"),
    ),
    "amx-w8a8": Kernel(
        "CPUInt8ScaledMMLinearKernel",
        "AMX int8 GEMM (int8_scaled_mm_with_quant, vLLM's sgl kernel; quantizes activations per token itself)",
        ("Selected CPUInt8ScaledMMLinearKernel",),
        formats=("w8a8",),
        needs=("symmetric_acts", "amx_int8_shape"),
    ),
    "zentorch-da8w4": Kernel(
        "ZentorchWNA16LinearKernel",
        "zentorch_dynamic_qlinear DA8W4: int4 weights x int8 dynamically quantized activations",
        ("Using ZentorchWNA16LinearKernel", "[zen_cpu] Using zentorch_dynamic_qlinear for DA8W4"),
        formats=("w4a16",),
        needs=("zentorch_group", "int4_w4a8", "bf16_acts", "symmetric_weights", "da8w4_group"),
    ),
    "zentorch-woq": Kernel(
        "ZentorchWNA16LinearKernel",
        "zentorch_woq_linear: int4 weights dequantized in the GEMM, bf16 activations (weight-only)",
        ("Using ZentorchWNA16LinearKernel", "[zen_cpu] Using zentorch_woq_linear for W4A16"),
        formats=("w4a16",),
        needs=("zentorch_group",),
    ),
    "zentorch-wna16-fallback": Kernel(
        "ZentorchWNA16LinearKernel",
        "cpu_gemm_wna16 (vLLM's generic int4 kernel): zentorch's int4 paths read only the compressed-tensors layout",
        ("Using ZentorchWNA16LinearKernel", "falling back to CPUWNA16LinearKernel"),
        formats=("gptq-w4a16", "awq-w4a16"),
        needs=("zentorch_group", "wna16_shape"),
    ),
    "amx-w4a8": Kernel(
        "CPUWNA16LinearKernel",
        "int4_scaled_mm_cpu (AMX W4A8): int4 weights repacked to the AWQ layout x int8 activations",
        ("Using CPUWNA16LinearKernel",),
        formats=INT4_WEIGHT_ONLY,
        needs=("wna16_shape", "int4_w4a8", "bf16_acts"),
    ),
    "wna16-amx": Kernel(
        "CPUWNA16LinearKernel",
        "cpu_gemm_wna16 isa=amx: int4 weights, bf16 activations",
        ("Using CPUWNA16LinearKernel",),
        formats=INT4_WEIGHT_ONLY,
        needs=("wna16_shape",),
    ),
    "wna16-vec": Kernel(
        "CPUWNA16LinearKernel",
        "cpu_gemm_wna16 isa=vec (AVX-512): int4 weights, 16-bit activations",
        ("Using CPUWNA16LinearKernel",),
        formats=INT4_WEIGHT_ONLY,
        needs=("wna16_shape",),
    ),
    "auto-round": Kernel(
        "ArkWNA16LinearKernel",
        "auto-round-lib's woqgemm (Intel's prebuilt JIT kernels for AVX2, AVX-512 and AMX): int4 weights repacked "
        "once at load, fp32 compute",
        ("Using ArkWNA16LinearKernel",),
        provider="service.kernels.ark_wna16",
        formats=INT4_WEIGHT_ONLY,
        needs=("ark_shape",),
        chosen_by="auto-round",
        requires="auto-round-lib (the service depends on it)",
    ),
    "ggml-q4_0": Kernel(
        "GgmlLinearKernel",
        "ggml's Q4_0 matmul (llama.cpp's CPU kernels, repacked 8x8 for AVX2 / AVX-512 at load): symmetric int4 "
        "weights x activations quantized per 32-block to int8",
        ("Using GgmlLinearKernel",),
        provider="service.kernels.ggml_linear",
        block_bytes=18,  # Q4_0: an fp16 scale and 16 nibble bytes
        formats=INT4_WEIGHT_ONLY,
        needs=("ggml_blocks", "symmetric_weights"),
        cites=("claim/int4-ggml-read/zen2",),
        chosen_by="ggml",
        requires="the service's ggml kernel (make kernels)",
        ggml_op=True,
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
        formats=INT4_WEIGHT_ONLY,
        needs=("ggml_blocks",),
        cites=("claim/int4-ggml-read/zen2",),
        chosen_by="ggml",
        requires="the service's ggml kernel (make kernels)",
        ggml_op=True,
    ),
    "ggml-q8_0": Kernel(
        "GgmlInt8LinearKernel",
        "ggml's Q8_0 matmul (llama.cpp's CPU kernels): int8 weights as stored x activations quantized per 32-block to "
        "int8 at run time (a checkpoint's static activation scales go unused)",
        ("Selected GgmlInt8LinearKernel",),
        provider="service.kernels.ggml_int8",
        block_bytes=34,  # Q8_0: an fp16 scale and 32 int8 values
        formats=("w8a8",),
        needs=("ggml_blocks",),
        cites=("claim/int8-ggml-read/zen2",),
        chosen_by="ggml",
        requires="the service's ggml kernel (make kernels)",
        ggml_op=True,
    ),
    "ggml-gguf": Kernel(
        "GgufBlocksLinearMethod",
        "ggml's matmul on a GGUF file's own blocks (llama.cpp's CPU kernels for their type): the linear layers' "
        "weights as the file stores them x activations quantized by ggml for that type",
        ("[service] GGUF blocks:",),
        provider="service.kernels.gguf_blocks",
        formats=("gguf",),
        needs=(),
        cites=("claim/gguf-blocks-dequantized/zen4", "claim/lm-head-blocks/emeraldrapids"),
        ggml_op=True,
    ),
    "bf16-weights": Kernel(
        "Bf16WeightsLinear",
        "the service's bf16-weight kernel for unquantized linear layers on a CPU without native bf16 (weights "
        "bf16 in memory, widened to fp32; a GEMV, then fp32 GEMM on widened chunks from 8 rows in an fp32 engine, "
        "16 in a bf16 one)",
        ("[service] bf16 weights:",),
        provider="service.kernels.bf16_linear",
        formats=("dense",),
        needs=(),
        cites=("claim/bf16-weights-engine/zen4", "claim/bf16-weights-gemv/avx2"),
    ),
    "amx-fp8": Kernel(
        "CPUFP8W8A8ScaledMMLinearKernel",
        "AMX fp8 GEMM (fp8_scaled_mm_cpu)",
        ("CPUFP8W8A8ScaledMMLinearKernel",),
        formats=("fp8",),
        needs=(),
    ),
    "torch-fp8": Kernel(
        "ChannelWiseTorchFP8ScaledMMLinearKernel",
        "torch._scaled_mm on the CPU (a generic reference path, not an optimised kernel)",
        ("TorchFP8ScaledMMLinearKernel",),
        formats=("fp8",),
        needs=(),
    ),
}
# The service's kernels that run ggml's op (their vLLM class names, as KERNELS_ENV lists them).
GGML_OP_CLASSES = frozenset(k.vllm_class for k in KERNELS.values() if k.ggml_op)


def setting_values(formats: tuple[str, ...]) -> tuple[str, ...]:
    """The values of a kernel setting (int4_kernel, int8_kernel) that choose one of the service's kernels for these
    formats, in this registry's order."""
    chosen = (k.chosen_by for k in KERNELS.values() if k.chosen_by and set(k.formats) & set(formats))
    return tuple(dict.fromkeys(chosen))
