"""The kernel registry (service/kernels/registry.py): every entry complete, so adding a kernel is one module plus
one entry, and an entry that leaves something out fails here."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

from service.facts.quantization import LinearShape, read_quantization
from service.kernels.registry import CONDITIONS, FORMATS, KERNELS, Kernel, Layer
from service.measurements.store import store
from tests.unit.policy.test_quant_policy import W4A16


def problems(name: str, kernel: Kernel) -> list[str]:
    """What an entry leaves out or gets wrong."""
    rows = store()
    found = []
    if not (kernel.vllm_class and kernel.op and kernel.log_markers):
        found.append(f"{name}: a vLLM class, what computes and the log lines that show it ran")
    if not kernel.formats or not set(kernel.formats) <= set(FORMATS):
        found.append(f"{name}: formats {kernel.formats} not among {FORMATS}")
    found += [f"{name}: condition {n} is not in CONDITIONS" for n in kernel.needs if n not in CONDITIONS]
    found += [f"{name}: cites {key}, not in the store" for key in kernel.cites if key not in rows.rows]
    if kernel.chosen_by and not (kernel.provider and kernel.requires):
        found.append(f"{name}: a setting chooses it, so it is the service's own and says what it requires")
    if kernel.provider:
        spec = importlib.util.find_spec(kernel.provider)
        source = Path(spec.origin).read_text() if spec and spec.origin else ""
        defined = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)} if source else set()
        if "register" not in defined:
            found.append(f"{name}: provider {kernel.provider} defines no register()")
        measured = kernel.cites or [r for r in rows.of_kind("quant") if r.params.get("kernel") == name]
        if not measured:
            found.append(f"{name}: the service's own kernel rests on no measurement")
    return found


def test_every_entry_is_complete():
    assert [p for name, kernel in KERNELS.items() for p in problems(name, kernel)] == []


def test_an_incomplete_entry_is_caught():
    ours = KERNELS["ggml-q8_0"]
    assert problems("x", dataclasses.replace(ours, formats=())) != []
    assert problems("x", dataclasses.replace(ours, needs=("no_such_condition",))) != []
    assert problems("x", dataclasses.replace(ours, cites=(), provider="service.kernels.ggml_int8_missing")) != []
    assert problems("x", dataclasses.replace(ours, cites=("claim/not-measured",))) != []
    assert problems("x", dataclasses.replace(ours, requires=None)) != []


def test_can_implement_says_what_a_layer_lacks():
    facts = read_quantization(W4A16)  # symmetric int4, groups of 128
    fits = Layer(facts, LinearShape("qkv_proj", 4096, 6144), "bfloat16", int4_w4a8=False, zentorch_w8a8=True)
    odd = Layer(facts, LinearShape("qkv_proj", 4096 + 16, 6144), "bfloat16", int4_w4a8=False, zentorch_w8a8=True)
    assert KERNELS["ggml-q4_0"].can_implement(fits) == (True, None)
    ok, why = KERNELS["ggml-q4_0"].can_implement(odd)
    assert not ok and why == CONDITIONS["ggml_blocks"][1]
    ok, why = KERNELS["amx-w4a8"].can_implement(fits)
    assert not ok and CONDITIONS["int4_w4a8"][1] in why


def test_a_kernel_that_runs_ggmls_op_gets_the_hand_over_table_by_its_attribute(monkeypatch):
    """No list to keep beside the registry: a kernel marked ggml_op is one whose planned class brings the table."""
    from service.kernels import registry
    from service.policy.linear import ggml_handover
    from service.policy.machine.backends import BACKENDS

    amx = BACKENDS["amx"]
    assert {k.vllm_class for k in KERNELS.values() if k.provider and "ggml" in k.provider} <= registry.GGML_OP_CLASSES
    assert ggml_handover.plan_handover("amx", amx.ggml_handover, "bfloat16", True, "SomeoneElsesKernel").decisions == ()
    added = dataclasses.replace(KERNELS["ggml-q8_0"], vllm_class="GgmlQ6KLinearKernel")
    monkeypatch.setattr(ggml_handover, "GGML_OP_CLASSES", frozenset({*registry.GGML_OP_CLASSES, added.vllm_class}))
    (decision,) = ggml_handover.plan_handover("amx", amx.ggml_handover, "bfloat16", True, added.vllm_class).decisions
    assert decision.setting == "env.SERVICE_GGML_HANDOVER"


def test_the_kernel_settings_values_are_the_registrys():
    """int4_kernel / int8_kernel: auto, vLLM's own, and each value a kernel of the registry is chosen by; the
    calibration weighs the same values."""
    import typing

    from service.kernels.registry import INT4_WEIGHT_ONLY, setting_values
    from service.settings import Settings

    for setting, formats in (("int4_kernel", INT4_WEIGHT_ONLY), ("int8_kernel", ("w8a8",))):
        allowed = set(typing.get_args(Settings.model_fields[setting].annotation))
        assert allowed == {"auto", "vllm", *setting_values(formats)}, setting
    assert setting_values(INT4_WEIGHT_ONLY) == ("auto-round", "ggml") and setting_values(("w8a8",)) == ("ggml",)
