"""Preload: the libraries found on disk (facts) and the LD_PRELOAD decided from them per backend (policy)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from service.facts.hardware import read_hardware
from service.facts.libraries import LibraryFacts, read_libraries
from service.policy.machine.backends import BACKENDS
from service.policy.machine.preload import choose_preload
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import Settings
from tests.unit.conftest import CPUINFO, software

TC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
IOMP = Path("/opt/venv/lib/libiomp5.so")
GOMP = Path("/opt/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1")
ALL = LibraryFacts(tcmalloc=TC, iomp5=IOMP, torch_gomp=GOMP)


def choose(backend: str, libraries: LibraryFacts, environ: dict[str, str]) -> SimpleNamespace:
    """The preload policy's result for one backend of the registry: its environment, its one decision, warnings."""
    result = choose_preload(BACKENDS[backend], libraries, environ)
    (decision,) = result.decisions
    return SimpleNamespace(env=result.env, decision=decision, warnings=result.warnings)


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_read_libraries_finds_each_where_its_package_puts_it(tmp_path):
    root, prefix, site = tmp_path / "root", tmp_path / "venv", tmp_path / "venv/lib/python3.11/site-packages"
    touch(root / "usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.9")
    tc = touch(root / "usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
    iomp = touch(prefix / "lib/libiomp5.so")
    touch(prefix / "lib/libiompstubs5.so")
    gomp = touch(site / "torch.libs/libgomp-a34b3233.so.1")
    facts = read_libraries(root=root, prefix=prefix, torch_dir=site / "torch", vllm_dir=site / "vllm")
    assert facts == LibraryFacts(tcmalloc=tc, iomp5=iomp, torch_gomp=gomp)


def test_read_libraries_on_a_bare_machine_finds_nothing(tmp_path):
    facts = read_libraries(root=tmp_path, prefix=tmp_path, torch_dir=tmp_path / "torch", vllm_dir=tmp_path / "vllm")
    assert facts == LibraryFacts(None, None, None)


def test_read_libraries_takes_vllms_bundled_tcmalloc_when_the_system_has_none(tmp_path):
    bundled = touch(tmp_path / "site/vllm/libs/libtcmalloc_minimal.so.4")
    facts = read_libraries(
        root=tmp_path / "root", prefix=tmp_path, torch_dir=tmp_path / "torch", vllm_dir=bundled.parents[1]
    )
    assert facts.tcmalloc == bundled


@pytest.mark.parametrize("backend", ["amx", "avx512", "avx2"])
def test_intel_and_generic_backends_preload_tcmalloc_and_intel_openmp(backend):
    choice = choose(backend, ALL, {})
    assert choice.env == {"LD_PRELOAD": f"{TC}:{IOMP}"}
    assert (choice.decision.setting, choice.decision.source) == ("env.LD_PRELOAD", "policy")
    assert "tcmalloc" in choice.decision.reason and "Intel OpenMP" in choice.decision.reason
    assert not choice.warnings


def test_zen_preloads_tcmalloc_and_torchs_gnu_openmp():
    choice = choose("zen", ALL, {})
    assert choice.env == {"LD_PRELOAD": f"{TC}:{GOMP}"}
    assert "zentorch" in choice.decision.reason and not choice.warnings


def test_user_ld_preload_wins():
    choice = choose("avx512", ALL, {"LD_PRELOAD": "/my/libjemalloc.so"})
    assert choice.env == {}
    assert (choice.decision.value, choice.decision.source) == ("/my/libjemalloc.so", "user")


def test_missing_tcmalloc_is_a_named_fallback():
    choice = choose("avx512", LibraryFacts(None, IOMP, GOMP), {})
    assert choice.env == {"LD_PRELOAD": str(IOMP)}
    assert choice.decision.reason.startswith("fallback, missing tcmalloc")
    assert len(choice.warnings) == 1 and "libtcmalloc-minimal4" in choice.warnings[0]


def test_missing_intel_openmp_falls_back_to_torchs_gnu_openmp():
    choice = choose("amx", LibraryFacts(TC, None, GOMP), {})
    assert choice.env == {"LD_PRELOAD": f"{TC}:{GOMP}"}
    assert "missing Intel OpenMP" in choice.decision.reason and "GNU OpenMP instead" in choice.decision.reason
    assert any("Intel OpenMP" in w for w in choice.warnings)


def test_nothing_found_sets_nothing_and_says_so():
    choice = choose("zen", LibraryFacts(None, None, None), {})
    assert choice.env == {} and choice.decision.value is None
    assert "tcmalloc and torch's GNU OpenMP" in choice.decision.reason
    assert len(choice.warnings) == 2


@pytest.mark.parametrize(
    ("cpu", "zen", "expected", "worker_var"),
    [
        ("epyc_9755_zen5.txt", True, GOMP, "worker_env.GOMP_CPU_AFFINITY"),
        ("epyc_9755_zen5.txt", False, IOMP, "worker_env.KMP_AFFINITY"),
        ("xeon_8480_sapphirerapids.txt", True, IOMP, "worker_env.KMP_AFFINITY"),
    ],
)
def test_engine_plan_carries_the_preload_and_the_workers_openmp_variables_follow_it(cpu, zen, expected, worker_var):
    plan = plan_engine(PlanInputs(read_hardware(cpuinfo_path=CPUINFO / cpu), None, software(zen), Settings(), {}, ALL))
    assert plan.env["LD_PRELOAD"] == f"{TC}:{expected}"
    assert [d for d in plan.decisions if d.setting == "env.LD_PRELOAD"][0].source == "policy"
    assert any(d.setting == worker_var for d in plan.decisions)
