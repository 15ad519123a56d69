"""Quantized checkpoints: the linear kernel vLLM 0.32 will run per (format x backend), the knobs that steer it, and a
pre-flight refusal where no CPU kernel exists.

Mirrors vLLM's own selection (model_executor/kernels/linear/__init__.py: _POSSIBLE_INT8_KERNELS and
_POSSIBLE_KERNELS for PlatformEnum.CPU, tried in order; then each kernel's can_implement and its weight repack) as a
table of data: RULES lists, per (format family, backend), the candidates in vLLM's order with the conditions each
needs; the first whose conditions hold is the kernel. Defaults between candidates come from measurements
(service/policy/quant_measurements.py), cited in each reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from service.facts.quantization import LinearShape, QuantFacts
from service.policy.decision import Decision, Source
from service.policy.quant_measurements import cite
from service.settings import Settings


@dataclass(frozen=True)
class Kernel:
    vllm_class: str  # the linear kernel class vLLM selects (named in its log)
    op: str  # what computes each quantized linear layer
    log_markers: tuple[str, ...]  # lines vLLM logs when it runs this kernel (for reading the choice back)


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
    "amx_int8_shape": (
        _shape(lambda c, s: s.in_features % 32 == 0 and s.out_features % 16 == 0),
        "input size a multiple of 32 and output size a multiple of 16",
    ),
}


@dataclass(frozen=True)
class Rule:
    needs: tuple[str, ...]
    kernel: str


# Per (format family, backend): the candidates in vLLM's order; the first whose conditions hold runs.
_W8A8_GENERIC = (Rule((), "onednn-w8a8"),)
_WNA16_VEC = (Rule(("wna16_shape",), "wna16-vec"),)
_WNA16_AMX = (Rule(("wna16_shape", "int4_w4a8", "bf16_acts"), "amx-w4a8"), Rule(("wna16_shape",), "wna16-amx"))
_ZEN_GPTQ_AWQ = (
    Rule(("zentorch_group", "wna16_shape"), "zentorch-wna16-fallback"),
    Rule(("wna16_shape",), "wna16-vec"),
)
RULES: dict[tuple[str, str], tuple[Rule, ...]] = {
    ("w8a8", "zen"): (
        Rule(("zentorch_w8a8", "dynamic_acts", "symmetric_acts", "channel_weights"), "zentorch-w8a8"),
        Rule((), "onednn-w8a8"),
    ),
    ("w8a8", "amx"): (Rule(("symmetric_acts", "amx_int8_shape"), "amx-w8a8"), Rule((), "onednn-w8a8")),
    ("w8a8", "avx512"): _W8A8_GENERIC,
    ("w8a8", "avx2"): _W8A8_GENERIC,
    ("w4a16", "zen"): (
        Rule(("zentorch_group", "int4_w4a8", "bf16_acts", "symmetric_weights", "da8w4_group"), "zentorch-da8w4"),
        Rule(("zentorch_group",), "zentorch-woq"),
        Rule(("wna16_shape",), "wna16-vec"),
    ),
    ("w4a16", "amx"): _WNA16_AMX,
    ("w4a16", "avx512"): _WNA16_VEC,
    ("gptq-w4a16", "zen"): _ZEN_GPTQ_AWQ,
    ("gptq-w4a16", "amx"): _WNA16_AMX,
    ("gptq-w4a16", "avx512"): _WNA16_VEC,
    ("awq-w4a16", "zen"): _ZEN_GPTQ_AWQ,
    ("awq-w4a16", "amx"): _WNA16_AMX,
    ("awq-w4a16", "avx512"): _WNA16_VEC,
    ("fp8", "amx"): (Rule((), "amx-fp8"),),
    ("fp8", "zen"): (Rule((), "torch-fp8"),),
    ("fp8", "avx512"): (Rule((), "torch-fp8"),),
    ("fp8", "avx2"): (Rule((), "torch-fp8"),),
}

# Kernels that run but are a fallback the user should know about (a warning, not a refusal).
FALLBACK_WARNINGS: dict[str, str] = {
    "torch-fp8": "fp8 checkpoint without AMX: vLLM 0.32 has no optimised fp8 CPU kernel here and falls back to "
    "torch._scaled_mm (unmeasured, expect it slow); an int8 (W8A8) or int4 (W4A16) copy runs on tuned kernels",
    "zentorch-wna16-fallback": "GPTQ/AWQ layout on Zen: zentorch's int4 kernels take only compressed-tensors "
    "checkpoints, so vLLM's generic cpu_gemm_wna16 runs; a compressed-tensors W4A16 copy of the model runs "
    "zentorch_woq_linear",
}

# Format checks before any kernel: (refused?, why) -- what vLLM 0.32 raises at load, said before the engine starts.
REFUSALS: tuple[tuple[Callable[[QuantFacts], bool], str], ...] = (
    (
        lambda f: f.act_order in ("group", "dynamic"),
        "compressed-tensors activation ordering actorder={act_order} (a g_idx per layer): vLLM 0.32 refuses it on "
        "every backend (compressed_tensors.py); re-quantize with actorder 'static'/'weight' or none",
    ),
    (
        lambda f: f.act_order == "desc_act" and f.group_size is not None,
        "GPTQ desc_act=True with groups (g_idx): vLLM 0.32 refuses it (gptq_utils.py); use a checkpoint with "
        "static activation ordering or desc_act=False",
    ),
    (
        lambda f: f.key in ("w8a16", "gptq-w8a16"),
        "8-bit weight-only ({key}): vLLM 0.32's CPU kernels (CPUWNA16, zentorch) take 4-bit weights only; use a "
        "W8A8 (int8 activations) or W4A16 copy",
    ),
    (
        lambda f: f.method == "gptq" and not f.weight_symmetric,
        "asymmetric GPTQ (sym=false): vLLM 0.32's GPTQ path takes symmetric weights only",
    ),
    (
        lambda f: f.method == "gptq" and f.group_size not in (None, 32, 64, 128),
        "GPTQ group size {group_size}: vLLM 0.32 accepts -1, 32, 64 or 128",
    ),
    (
        lambda f: f.key == "w8a8" and not f.weight_symmetric,
        "asymmetric int8 weights: vLLM 0.32's W8A8 schemes take symmetric weights only",
    ),
)


# (format family, backend) where vLLM 0.32 selects a kernel whose op is missing from the kernel build it loads for
# that CPU: refused before the engine starts, since the engine would die at its first forward pass.
MISSING_IN_BUILD: dict[tuple[str, str], str] = {
    (family, "avx2"): "vLLM 0.32's only x86 int4 kernel (CPUWNA16LinearKernel, op cpu_gemm_wna16) is not in its AVX2 "
    "kernel build (_C_AVX2, loaded on CPUs without AVX-512): the engine would die at the first forward pass; "
    "serve the unquantized model or a W8A8 copy (oneDNN int8 runs on AVX2)"
    for family in ("w4a16", "gptq-w4a16", "awq-w4a16")
}

ALREADY = "already set in the environment"


@dataclass(frozen=True)
class QuantPlan:
    decisions: tuple[Decision, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


def describe(f: QuantFacts) -> str:
    weights = f"{f.weight_type}{f.weight_bits} weights, " + (
        f"groups of {f.group_size}" if f.group_size else f"per-{f.weight_strategy or 'channel'} scales"
    )
    weights += ", symmetric" if f.weight_symmetric else ", asymmetric (zero points)"
    order = f", act-order {f.act_order}" if f.act_order else ", no act-order"
    if f.activation_scheme:
        acts = f"int{f.activation_bits} activations, {f.activation_scheme} per-{f.activation_strategy} scales, " + (
            "symmetric" if f.activation_symmetric is not False else "asymmetric"
        )
    else:
        acts = "activations not quantized (16-bit)"
    fmt = f" {f.format}" if f.format and f.format != f.method else ""
    return f"{f.method}{fmt}: {weights}{order}; {acts}"


def _choose(rules: tuple[Rule, ...], layer: Layer) -> tuple[str | None, list[str]]:
    """The first rule whose conditions hold, and why each earlier one did not."""
    passed_over: list[str] = []
    for rule in rules:
        missing = [CONDITIONS[c][1] for c in rule.needs if not CONDITIONS[c][0](layer)]
        if not missing:
            return rule.kernel, passed_over
        passed_over.append(f"not {rule.kernel} (needs {', '.join(missing)})")
    return None, passed_over


def _int4_knob(
    facts: QuantFacts, backend: str, settings: Settings, user: frozenset[str], environ: Mapping[str, str]
) -> tuple[bool, Decision | None]:
    """VLLM_CPU_INT4_W4A8: int8 activations for int4 weights (DA8W4 on Zen, AMX W4A8) or weight-only."""
    name = "VLLM_CPU_INT4_W4A8"
    if facts.weight_bits != 4 or facts.activation_bits != 16:
        return True, None
    if "int4_w4a8" in user and settings.int4_w4a8 is not None:
        value = settings.int4_w4a8
        return value, Decision(f"env.{name}", "1" if value else "0", "set by the user (int4_w4a8)", "user")
    if name in environ:
        value = environ[name] != "0"
        return value, Decision(f"env.{name}", environ[name], ALREADY, "user")
    if backend == "zen" and facts.method == "compressed-tensors":
        why = (
            "Zen int4 default: weight-only zentorch_woq_linear, not DA8W4 (vLLM's default) -- "
            + cite("zen", "w4a16", ("zentorch-woq", "zentorch-da8w4", "wna16-vec"))
            + "; set int4_w4a8=true for DA8W4"
        )
        return False, Decision(f"env.{name}", "0", why, "policy")
    if backend == "amx":
        why = "vLLM's default (AMX W4A8 for bf16 activations); " + cite("amx", "w4a16", ("amx-w4a8", "wna16-amx"))
        return True, Decision(f"env.{name}", "1", why, "default")
    return True, None  # no effect here (read only by zentorch's compressed-tensors path and AMX): left unset


def _w8a8_knob(
    facts: QuantFacts, backend: str, settings: Settings, user: frozenset[str], environ: Mapping[str, str]
) -> tuple[bool, Decision | None, str]:
    """On Zen, W8A8 runs zentorch_dynamic_qlinear unless ZentorchInt8ScaledMMLinearKernel is disabled."""
    name, kernel = "VLLM_DISABLED_KERNELS", "ZentorchInt8ScaledMMLinearKernel"
    already = [k for k in environ.get(name, "").split(",") if k]
    if facts.key != "w8a8" or backend != "zen":
        return kernel not in already, None, ""
    measured = cite("zen", "w8a8", ("zentorch-w8a8", "onednn-w8a8"))
    if "w8a8_zentorch" in user and settings.w8a8_zentorch is False:
        value = ",".join([*already, kernel])
        why = f"set by the user (w8a8_zentorch=false): vLLM's oneDNN int8 kernel, which favours prefill -- {measured}"
        return False, Decision(f"env.{name}", value, why, "user"), "user"
    if kernel in already:
        return False, Decision(f"env.{name}", environ[name], ALREADY, "user"), "user"
    if "w8a8_zentorch" in user and settings.w8a8_zentorch:
        return True, None, f"set by the user (w8a8_zentorch=true): zentorch favours decode -- {measured}"
    favour = (
        "the default favours decode (zentorch_dynamic_qlinear) over prefill (oneDNN int8) -- "
        f"{measured}; set w8a8_zentorch=false (SERVICE_W8A8_ZENTORCH=false) for prefill-heavy loads"
    )
    return True, None, favour


def unknown_method_error(method: str, known: frozenset[str]) -> str:
    hint = (
        "; a GGUF model is served from its .gguf file (SERVICE_MODEL=/path/model.gguf), which the service converts"
        if method == "gguf"
        else ""
    )
    return (
        f"the model's quantization_config names quant_method {method!r}, which vLLM's CPU build does not have "
        f"(it knows {', '.join(sorted(known))}){hint}"
    )


def plan_quant(
    facts: QuantFacts | None,
    backend: str | None,
    dtype: str | None,
    settings: Settings,
    environ: Mapping[str, str],
    known_methods: frozenset[str] | None = None,  # the installed vLLM's quantization methods (None: not checked)
) -> QuantPlan:
    if facts is None or backend is None:
        return QuantPlan()
    if known_methods and facts.method not in known_methods:
        return QuantPlan(errors=(unknown_method_error(facts.method, known_methods),))
    user = settings.explicitly_set()
    decisions = [Decision("quant.format", facts.key, describe(facts), "default")]
    for refused, message in REFUSALS:
        if refused(facts):
            error = "quantized model: " + message.format(**vars(facts), key=facts.key)
            return QuantPlan(tuple(decisions), errors=(error,))
    missing = MISSING_IN_BUILD.get((facts.key, backend))
    if missing:
        return QuantPlan(tuple(decisions), errors=(f"quantized model ({describe(facts)}) on {backend}: {missing}",))
    rules = RULES.get((facts.key, backend))
    if rules is None:
        warning = (
            f"quantization {facts.key} ({describe(facts)}) on {backend}: no kernel in the service's table; "
            "left to vLLM, unmeasured"
        )
        decisions.append(Decision("quant.linear_kernel", "vllm-auto", warning, "default"))
        return QuantPlan(tuple(decisions), warnings=(warning,))

    env: dict[str, str] = {}
    w4a8, int4_decision = _int4_knob(facts, backend, settings, user, environ)
    zentorch_w8a8, w8a8_decision, favour = _w8a8_knob(facts, backend, settings, user, environ)
    for d in (int4_decision, w8a8_decision):
        if d is not None:
            decisions.append(d)
            if d.reason != ALREADY:
                env[d.setting.removeprefix("env.")] = str(d.value)

    shapes = facts.linear_shapes or (None,)
    chosen: dict[str, list[str]] = {}
    why_not: dict[str, list[str]] = {}
    refused_layers = []
    for shape in shapes:
        layer = Layer(facts, shape, dtype or "bfloat16", w4a8, zentorch_w8a8)
        kernel, passed_over = _choose(rules, layer)
        label = shape.name if shape else "all layers"
        if kernel is None:
            refused_layers.append(f"{label} ({'; '.join(passed_over)})")
            continue
        chosen.setdefault(kernel, []).append(label)
        why_not.setdefault(kernel, passed_over)
    if refused_layers:
        error = (
            f"quantized model ({describe(facts)}): no {backend} kernel in vLLM 0.32 for "
            + ", ".join(refused_layers)
            + "; leave those layers unquantized (ignore list) or re-quantize with shapes/groups that fit"
        )
        return QuantPlan(tuple(decisions), env, errors=(error,))

    user_steered = any(d is not None and d.source == "user" for d in (int4_decision, w8a8_decision)) or (
        favour.startswith("set by the user")
    )
    reasons = []
    for kernel, layers in chosen.items():
        k = KERNELS[kernel]
        text = f"{', '.join(layers)}: {k.vllm_class} -> {k.op}"
        if why_not[kernel]:
            text += f" ({'; '.join(why_not[kernel])})"
        reasons.append(text)
    measured = _measurement_note(facts.key, backend, tuple(chosen), favour)
    notes = [f"activations {dtype}", *([measured] if measured else [])]
    if backend == "zen":
        notes.append(
            "VLLM_ZENTORCH_WEIGHT_PREPACK applies to the unquantized layers; quantized ones are repacked by "
            "their kernel at load"
        )
    source: Source = "user" if user_steered else "policy"
    value = "+".join(chosen)
    decisions.append(Decision("quant.linear_kernel", value, "; ".join(reasons + notes), source))
    warnings = tuple(FALLBACK_WARNINGS[k] for k in chosen if k in FALLBACK_WARNINGS)
    return QuantPlan(tuple(decisions), env, warnings)


def _measurement_note(key: str, backend: str, kernels: tuple[str, ...], favour: str) -> str:
    if favour:
        return favour
    fmt = {"w8a8": "w8a8", "w4a16": "w4a16"}.get(key)
    if fmt is None:
        return f"{key} not measured (bench/quant_kernels.py builds W8A8 and W4A16 only)"
    return cite(backend, fmt, (*kernels, "bf16"))
