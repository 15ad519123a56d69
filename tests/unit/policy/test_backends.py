"""The backend registry: every backend answers every table the policies read, and what they name exists."""

from __future__ import annotations

import importlib.util
from typing import get_args

import pytest

from service.facts.vllm_kernel_limits import BackendKernels
from service.kernels.registry import CONDITIONS, FAMILIES, KERNELS
from service.policy.engine.dtype import MEASUREMENTS
from service.policy.linear.quant_measurements import MEASUREMENTS as QUANT_MEASUREMENTS
from service.policy.machine.backends import BACKENDS, ORDER


@pytest.mark.parametrize("name", ORDER)
def test_each_backend_answers_every_format_family(name):
    backend = BACKENDS[name]
    assert set(backend.quant) == set(FAMILIES), f"{name} leaves {set(FAMILIES) ^ set(backend.quant)} unanswered"
    for family, rules in backend.quant.items():
        if isinstance(rules, str):
            assert rules, f"{name} refuses {family} without saying why"
            continue
        for rule in rules:
            assert rule.kernel in KERNELS and all(c in CONDITIONS for c in rule.needs), (name, family, rule)


@pytest.mark.parametrize("name", ORDER)
def test_each_backend_names_a_platform_vllm_has_and_what_it_computes(name):
    backend = BACKENDS[name]
    module, _, cls = backend.platform.rpartition(".")
    assert importlib.util.find_spec(module) is not None, backend.platform
    source = importlib.util.find_spec(module).origin
    assert f"class {cls}" in open(source).read()
    assert isinstance(backend.kernels, BackendKernels) and backend.kernels.dtypes
    assert backend.openmp in ("intel", "gnu") and backend.computes_with
    assert set(backend.lowers_to) <= set(BACKENDS) - {name}
    for module in backend.platform_imports:
        assert importlib.util.find_spec(module) is not None, f"{name} imports {module}, which is not installed"


def test_dtype_classes_are_the_registrys_and_measured_classes_exist():
    classes = {b.dtype_class for b in BACKENDS.values()}
    assert set(MEASUREMENTS) <= classes | {"native-bf16"}


def test_quantization_measurements_name_registry_backends_and_kernels():
    for m in QUANT_MEASUREMENTS:
        assert m.machine.backend in BACKENDS
        assert m.kernel == "bf16" or m.kernel in KERNELS


def test_settings_accept_exactly_the_registrys_backends():
    from service.settings import BackendName

    assert get_args(BackendName) == ("auto", *ORDER)
