"""Quantized checkpoints: the linear kernel vLLM 0.32 will run for each layer on this backend, the knobs that steer
it, and a pre-flight refusal where no CPU kernel exists.

The candidates per backend and format family come from the backend registry (service/policy/machine/backends.py), in vLLM's
order, with the conditions each needs (service/policy/linear/kernel_candidates.py); the first whose conditions hold is the
kernel. Int4 weight-only and W8A8 checkpoints run either those or one of the service's own kernels (ggml's,
auto-round-lib's), per backend default, calibration or the user's int4_kernel / int8_kernel. Defaults between
candidates come from measurements (service/policy/linear/quant_measurements.py), cited in each reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from service.facts.quantization import QuantFacts
from service.in_vllm.contract import KERNELS_ENV
from service.kernels.registry import KERNELS, Layer
from service.policy.linear.kernel_candidates import (
    FALLBACK_WARNINGS,
    HANDOVERS,
    INT8_HANDOVER,
    OURS,
    SATURATES_WITHOUT_VNNI,
    Handover,
    Rule,
)
from service.policy.linear.quant_measurements import cite
from service.policy.machine.backends import Backend
from service.policy.plan.decision import Decision, PolicyResult, Source, env, record
from service.settings import Settings

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


ALREADY = "already set in the environment"


@dataclass(frozen=True)
class Knob:
    """A knob's state for the kernel choice, the decision recording it (if any), and whether the user steered it."""

    enabled: bool
    decision: Decision | None = None
    by_user: bool = False
    favour: str = ""  # what the default favours, and the measurement behind it


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
        fits, missing = KERNELS[rule.kernel].can_implement(layer)
        if fits:
            return rule.kernel, passed_over
        passed_over.append(f"not {rule.kernel} (needs {missing})")
    return None, passed_over


def _int4_knob(
    facts: QuantFacts,
    backend: Backend,
    settings: Settings,
    user: frozenset[str],
    environ: Mapping[str, str],
    calibrated: Mapping[str, Any],
) -> Knob:
    """VLLM_CPU_INT4_W4A8: int8 activations for int4 weights (DA8W4 on Zen, AMX W4A8) or weight-only."""
    name = "VLLM_CPU_INT4_W4A8"
    default = backend.int4_w4a8
    if facts.weight_bits != 4 or facts.activation_bits != 16:
        return Knob(True)
    if "int4_w4a8" in user and settings.int4_w4a8 is not None:
        value = settings.int4_w4a8
        return Knob(value, env(name, "1" if value else "0", "set by the user (int4_w4a8)", "user"), by_user=True)
    if name in environ:
        return Knob(environ[name] != "0", record("env", name, environ[name], ALREADY, "user"), by_user=True)
    if default is None or facts.method not in default.methods:
        return Knob(True)  # no effect here (not read by this backend's path for this format): left unset
    if "int4_w4a8" in calibrated:
        value = bool(calibrated["int4_w4a8"])
        why = f"calibrated on this machine (int4_w4a8={str(value).lower()})"
        return Knob(value, env(name, "1" if value else "0", why, "calibration"))
    why = default.why + " -- " + cite(backend.name, "w4a16", default.measured)
    if not default.value:
        why += "; set int4_w4a8=true for DA8W4"
    return Knob(default.value, env(name, "1" if default.value else "0", why, "policy"))


@dataclass(frozen=True)
class KernelChoice:
    """Whose kernel runs a family the service has kernels for ("vllm", or one of the service's: the handover's
    `ours`), and why."""

    handover: Handover
    kernel: str
    why: str
    source: Source
    error: str | None = None

    @property
    def ours(self) -> bool:
        return self.kernel in self.handover.ours


def _our_kernel(
    handover: Handover,
    backend: Backend,
    settings: Settings,
    user: frozenset[str],
    installed: Mapping[str, str | None],
    calibrated: Mapping[str, Any],
    misfit: Callable[[str], str | None],
    vnni: bool,
) -> KernelChoice:
    setting = handover.setting
    if setting not in user and setting in calibrated:
        kernel = calibrated[setting]
        why = f"calibrated on this machine ({setting}={kernel})"
        missing = f"{OURS[kernel]} is not installed" if kernel in OURS and not installed.get(kernel) else None
        return KernelChoice(handover, kernel, why, "calibration", missing)
    requested = getattr(settings, setting) if setting in user else "auto"
    if requested == "vllm":
        return KernelChoice(handover, "vllm", f"set by the user ({setting}=vllm)", "user")
    if requested in handover.ours:
        if not installed.get(requested):
            error = f"{setting}={requested} was set, but {OURS[requested]} is not installed"
            return KernelChoice(handover, "vllm", "", "user", error)
        why = f"set by the user ({setting}={requested}, {installed[requested]})"
        return KernelChoice(handover, requested, why, "user")
    default = getattr(backend, setting)
    measured = cite(backend.name, handover.measured_as, default.measured)
    why = default.why + (f" -- {measured}" if default.measured else "")
    order = default.kernels
    if handover is INT8_HANDOVER and not vnni and order[0] == "vllm":
        order = (*(k for k in (*order, *handover.ours) if k != "vllm"), "vllm")
        why += "; but the service's first on this CPU, whose int8 dot products saturate in vLLM's (no VNNI)"
    for kernel in order:
        if kernel == "vllm":
            return KernelChoice(handover, "vllm", why, "policy")
        if not installed.get(kernel):
            why += f"; {OURS[kernel]} is not installed"
        elif layers := misfit(kernel):
            why += f"; not {kernel}, which does not run {layers}"
        else:
            return KernelChoice(handover, kernel, f"{why}: the service's kernel ({installed[kernel]})", "policy")
    return KernelChoice(handover, "vllm", why, "policy")  # the backend's own table, which says what it lacks


def _handover_decisions(choice: KernelChoice, environ: Mapping[str, str]) -> tuple[Decision, ...]:
    """Register the service's kernel in every vLLM process, and take vLLM's own kernels of the family out of its
    way."""
    name = "VLLM_DISABLED_KERNELS"
    already = [k for k in environ.get(name, "").split(",") if k]
    disabled = ",".join([*already, *(k for k in choice.handover.vllm_kernels if k not in already)])
    kind = choice.handover.kind
    return (
        env(
            KERNELS_ENV,
            KERNELS[choice.handover.ours[choice.kernel][0].kernel].vllm_class,
            f"{choice.why}; the service's vLLM plugin registers it in every vLLM process",
            choice.source,
        ),
        env(
            name, disabled, f"vLLM tries its own {kind} kernels before registered ones: they step aside", choice.source
        ),
    )


def _w8a8_knob(
    facts: QuantFacts,
    backend: Backend,
    settings: Settings,
    user: frozenset[str],
    environ: Mapping[str, str],
    calibrated: Mapping[str, Any],
) -> Knob:
    """Where the backend has zentorch's W8A8 kernel, it runs unless ZentorchInt8ScaledMMLinearKernel is disabled."""
    name, kernel = "VLLM_DISABLED_KERNELS", "ZentorchInt8ScaledMMLinearKernel"
    already = [k for k in environ.get(name, "").split(",") if k]
    if facts.key != "w8a8" or not backend.w8a8_zentorch:
        return Knob(kernel not in already)
    measured = cite(backend.name, "w8a8", ("zentorch-w8a8", "onednn-w8a8"))
    if "w8a8_zentorch" in user and settings.w8a8_zentorch is False:
        value = ",".join([*already, kernel])
        why = f"set by the user (w8a8_zentorch=false): vLLM's oneDNN int8 kernel, which favours prefill -- {measured}"
        return Knob(False, env(name, value, why, "user"), by_user=True)
    if kernel in already:
        return Knob(False, record("env", name, environ[name], ALREADY, "user"), by_user=True)
    if "w8a8_zentorch" in user and settings.w8a8_zentorch:
        return Knob(
            True, by_user=True, favour=f"set by the user (w8a8_zentorch=true): zentorch favours decode -- {measured}"
        )
    if "w8a8_zentorch" in calibrated:
        why = f"calibrated on this machine (w8a8_zentorch={str(calibrated['w8a8_zentorch']).lower()})"
        if not calibrated["w8a8_zentorch"]:
            return Knob(False, env(name, ",".join([*already, kernel]), why, "calibration"))
        return Knob(True, favour=why)
    favour = (
        "the default favours decode (zentorch_dynamic_qlinear) over prefill (oneDNN int8) -- "
        f"{measured}; set w8a8_zentorch=false (SERVICE_W8A8_ZENTORCH=false) for prefill-heavy loads"
    )
    return Knob(True, favour=favour)


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
    backend: Backend | None,
    dtype: str | None,
    settings: Settings,
    environ: Mapping[str, str],
    known_methods: frozenset[str] | None = None,  # the installed vLLM's quantization methods (None: not checked)
    auto_round_lib: str | None = None,  # the installed auto-round-lib's version (the service's int4 kernel)
    calibrated: Mapping[str, Any] | None = None,  # settings the calibration chose on this machine (policy/calibration)
    ggml_kernel: str | None = None,  # what the service's ggml kernel was built from, if it is built
    *,
    vnni: bool,  # the CPU's int8 dot products accumulate in int32 (Isa.vnni)
) -> PolicyResult:
    if facts is None or backend is None:
        return PolicyResult()
    if known_methods and facts.method not in known_methods:
        return PolicyResult(errors=(unknown_method_error(facts.method, known_methods),))
    user = settings.explicitly_set()
    fmt = record("quant", "format", facts.key, describe(facts), "default")
    for refused, message in REFUSALS:
        if refused(facts):
            return PolicyResult.of(fmt, errors=["quantized model: " + message.format(**vars(facts), key=facts.key)])
    installed = {"auto-round": auto_round_lib and f"auto-round-lib {auto_round_lib}", "ggml": ggml_kernel}

    handover = next((h for h in HANDOVERS if facts.key in h.families), None)

    misfit = partial(_misfit, facts, dtype, handover)
    choice = (
        _our_kernel(handover, backend, settings, user, installed, calibrated or {}, misfit, vnni) if handover else None
    )
    if choice and choice.error:
        return PolicyResult.of(fmt, errors=[f"quantized model ({describe(facts)}): {choice.error}"])
    rules = choice.handover.ours[choice.kernel] if choice and choice.ours else backend.quant.get(facts.key)
    if isinstance(rules, str):
        why_not_ours = f" ({choice.why})" if choice else ""
        return PolicyResult.of(
            fmt, errors=[f"quantized model ({describe(facts)}) on {backend.name}: {rules}{why_not_ours}"]
        )
    if rules is None:
        warning = (
            f"quantization {facts.key} ({describe(facts)}) on {backend.name}: no kernel in the service's table; "
            "left to vLLM, unmeasured"
        )
        return PolicyResult.of(
            fmt, record("quant", "linear_kernel", "vllm-auto", warning, "default"), warnings=[warning]
        )

    ours = choice is not None and choice.ours
    int4 = Knob(True) if ours else _int4_knob(facts, backend, settings, user, environ, calibrated or {})
    w8a8 = Knob(True) if ours else _w8a8_knob(facts, backend, settings, user, environ, calibrated or {})
    chosen, why_not, refused_layers = _per_layer(rules, facts, dtype, int4, w8a8)
    handed = _handover_decisions(choice, environ) if choice and choice.ours else ()
    knobs = (fmt, int4.decision, w8a8.decision, *handed)
    if refused_layers:
        error = (
            f"quantized model ({describe(facts)}): no {backend.name} kernel in vLLM 0.32 for "
            + ", ".join(refused_layers)
            + "; leave those layers unquantized (ignore list) or re-quantize with shapes/groups that fit"
        )
        return PolicyResult.of(*knobs, errors=[error])

    kernel_decision, warnings = _kernel_decision(facts, backend, dtype, chosen, why_not, int4, w8a8, choice, vnni)
    return PolicyResult.of(*knobs, kernel_decision, warnings=warnings)


def _misfit(facts: QuantFacts, dtype: str | None, handover: Handover | None, kernel: str) -> str | None:
    """The layers none of the kernel's candidates runs, said as the policy's refusal would."""
    assert handover is not None
    layers = [Layer(facts, shape, dtype or "bfloat16", False, False) for shape in facts.linear_shapes or (None,)]
    out = [
        f"{layer.shape.name if layer.shape else 'all layers'} ({'; '.join(why)})"
        for layer in layers
        for chosen, why in [_choose(handover.ours[kernel], layer)]
        if chosen is None
    ]
    return ", ".join(out) or None


def _per_layer(
    rules: tuple[Rule, ...], facts: QuantFacts, dtype: str | None, int4: Knob, w8a8: Knob
) -> tuple[dict[str, list[str]], dict[str, list[str]], list[str]]:
    """Per kernel, the layers it runs and why the candidates before it did not; and the layers no candidate runs."""
    chosen: dict[str, list[str]] = {}
    why_not: dict[str, list[str]] = {}
    refused_layers = []
    for shape in facts.linear_shapes or (None,):
        layer = Layer(facts, shape, dtype or "bfloat16", int4.enabled, w8a8.enabled)
        kernel, passed_over = _choose(rules, layer)
        label = shape.name if shape else "all layers"
        if kernel is None:
            refused_layers.append(f"{label} ({'; '.join(passed_over)})")
            continue
        chosen.setdefault(kernel, []).append(label)
        why_not.setdefault(kernel, passed_over)
    return chosen, why_not, refused_layers


def _kernel_decision(
    facts: QuantFacts,
    backend: Backend,
    dtype: str | None,
    chosen: dict[str, list[str]],
    why_not: dict[str, list[str]],
    int4: Knob,
    w8a8: Knob,
    choice: KernelChoice | None,
    vnni: bool,
) -> tuple[Decision, list[str]]:
    """The quantized layers' kernel decision, with what it rests on, and the warnings its kernels carry."""
    reasons = []
    for kernel, layers in chosen.items():
        k = KERNELS[kernel]
        text = f"{', '.join(layers)}: {k.vllm_class} -> {k.op}"
        if why_not[kernel]:
            text += f" ({'; '.join(why_not[kernel])})"
        reasons.append(text)
    measured = w8a8.favour or _measurement_note(facts.key, backend.name, tuple(chosen))
    saturates = [] if vnni else [SATURATES_WITHOUT_VNNI[k] for k in chosen if k in SATURATES_WITHOUT_VNNI]
    notes = [
        *saturates,
        *([choice.why] if choice else []),
        f"activations {dtype}",
        *([measured] if measured else []),
        *([backend.quant_note] if backend.quant_note else []),
    ]
    by_user = int4.by_user or w8a8.by_user or (choice is not None and choice.source == "user")
    calibrated_here = any(k.decision is not None and k.decision.source == "calibration" for k in (int4, w8a8))
    calibrated_here = calibrated_here or w8a8.favour.startswith("calibrated")
    calibrated_here = calibrated_here or (choice is not None and choice.source == "calibration")
    source: Source = "user" if by_user else "calibration" if calibrated_here else "policy"
    kernel_decision = record("quant", "linear_kernel", "+".join(chosen), "; ".join(reasons + notes), source)
    warnings = [FALLBACK_WARNINGS[k] for k in chosen if k in FALLBACK_WARNINGS] + saturates
    return kernel_decision, warnings


# The bench's copies (bench/parts/quant_kernels.py builds W8A8 and W4A16) per format key. A GPTQ or AWQ int4 checkpoint is
# repacked at load into the layout its kernel also takes a W4A16 copy in, so the kernel's W4A16 figures are its own.
MEASURED_AS = {"w8a8": "w8a8", "w4a16": "w4a16", "gptq-w4a16": "w4a16", "awq-w4a16": "w4a16"}


def _measurement_note(key: str, backend: str, kernels: tuple[str, ...]) -> str:
    fmt = MEASURED_AS.get(key)
    if fmt is None:
        return f"{key} not measured (bench/parts/quant_kernels.py builds W8A8 and W4A16 only)"
    note = cite(backend, fmt, (*kernels, "bf16"))
    return note if fmt == key else f"the same kernels on a {fmt.upper()} copy: {note}"
