"""The candidates of the calibration's questions that the plan asks: the int4 and W8A8 kernels the user left open,
zentorch's weight prepack, each as the settings it stands for and what the policy then runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from service.facts.model import ModelFacts
from service.in_vllm.contract import HANDOVER_ENV, KERNELS_ENV, PREPACK_ENV
from service.kernels.registry import INT4_WEIGHT_ONLY, setting_values
from service.policy.machine.backends import Backend
from service.policy.plan.calibration import Candidate, Question, dense_question
from service.policy.plan.decision import PolicyResult

CALIBRATED_ENV = ("VLLM_CPU_INT4_W4A8", "VLLM_DISABLED_KERNELS", KERNELS_ENV, HANDOVER_ENV)


def int4_options(user: frozenset[str], backend: Backend, method: str) -> list[tuple[str, dict[str, Any]]]:
    """The int4 settings the calibration can weigh here: none the user set."""
    if "int4_kernel" in user:
        return []
    w4a8: list[bool | None] = [None]
    if "int4_w4a8" not in user and backend.int4_w4a8 is not None and method in backend.int4_w4a8.methods:
        w4a8 = [False, True]
    options: list[tuple[str, dict[str, Any]]] = [
        (
            "vllm" if a is None else f"vllm-{'w4a8' if a else 'weight-only'}",
            {"int4_kernel": "vllm"} | ({} if a is None else {"int4_w4a8": a}),
        )
        for a in w4a8
    ]
    return [*options, *((v, {"int4_kernel": v}) for v in setting_values(INT4_WEIGHT_ONLY))]


def w8a8_options(
    user: frozenset[str], backend: Backend, environ: Mapping[str, str], vnni: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The W8A8 settings the calibration can weigh here: vLLM's kernel (zentorch's or oneDNN's where the backend has
    both and neither the user's setting nor their VLLM_DISABLED_KERNELS chose) or the service's ggml one. Where the
    user set int8_kernel, every option plans their kernel and they fold into one candidate. Without VNNI vLLM's
    oneDNN kernel saturates (kernel_candidates.SATURATES_WITHOUT_VNNI): its speed is not weighed against an exact one."""
    ours = [(v, {"int8_kernel": v}) for v in setting_values(("w8a8",))]
    if not vnni:
        return ours
    vllm: list[tuple[str, dict[str, Any]]] = [("vllm", {"int8_kernel": "vllm"})]
    if backend.w8a8_zentorch and "w8a8_zentorch" not in user and "VLLM_DISABLED_KERNELS" not in environ:
        vllm = [
            (name, {"int8_kernel": "vllm", "w8a8_zentorch": on}) for name, on in (("zentorch", True), ("onednn", False))
        ]
    return [*vllm, *ours]


def candidates(
    quant: Callable[[Mapping[str, Any]], PolicyResult], options: list[tuple[str, dict[str, Any]]]
) -> tuple[tuple[Candidate, ...], str]:
    """Each option with what the policy then runs (kernel, the environment the kernels read), options that plan the
    same kernel being one candidate; and the name of the one the table picks."""

    def planned(settings: Mapping[str, Any]) -> tuple[str | None, dict[str, str], bool]:
        result = quant(settings)
        kernel = next((d.value for d in result.decisions if d.setting == "quant.linear_kernel"), None)
        return kernel, {k: v for k, v in result.env.items() if k in CALIBRATED_ENV}, bool(result.errors)

    seen: dict[str, Candidate] = {}
    for name, settings in options:
        kernel, env_, failed = planned(settings)
        if not failed and kernel is not None:
            seen.setdefault(kernel, Candidate(name, settings, kernel, env_))
    default = seen.get(str(planned({})[0]))
    return tuple(seen.values()), default.name if default else ""


def prepack_question(model: ModelFacts, backend_decided: PolicyResult, dtype: str) -> tuple[Question, ...]:
    """zentorch's weight prepack, where the backend decides it and the user did not: on or off for the model's
    unquantized linear layers ("faster GEMMs" is zentorch's claim, not a measurement on this CPU)."""
    decided = next((d for d in backend_decided.decisions if d.name == PREPACK_ENV), None)
    if decided is None or decided.source == "user" or model.quant is not None or not model.linear_shapes:
        return ()
    candidates = tuple(
        Candidate(name, {"zentorch_weight_prepack": on}, name, {PREPACK_ENV: "1" if on else "0"})
        for name, on in (("prepacked", True), ("not-prepacked", False))
    )
    default = "prepacked" if decided.value == "1" else "not-prepacked"
    return (dense_question("zentorch_weight_prepack", default, candidates, model.linear_shapes, dtype),)
