"""Which CPU backend runs the engine (service/policy/machine/backends.py lists them, best first), or a refusal that says why.

vLLM picks its kernel build from the CPU itself (the _C build with AMX/AVX-512 BF16, else _C_AVX512, else
_C_AVX2): the service can confirm that part but never force it lower. The platform class is the one thing it can
choose, through its vLLM platform plugin (service/in_vllm/plugin.py); an entry's `lowers_to` lists the backends that
differ from it by the platform class alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.facts.cpu import CpuInfo
from service.facts.software import SoftwareFacts
from service.policy.machine.backends import BACKENDS, ORDER, Backend

LOWERING_REASON = (
    "requested: vLLM's generic CpuPlatform instead of ZenCpuPlatform, zentorch off (the escape hatch when "
    "zentorch misbehaves on a model, and the A/B switch against backend: auto)"
)


@dataclass(frozen=True)
class BackendChoice:
    name: str | None  # None when the machine cannot run any backend
    reason: str
    requested: str
    error: str | None = None
    calibrated: bool = False  # chosen over the table's by the calibration's timings on this machine

    @property
    def entry(self) -> Backend | None:
        return BACKENDS.get(self.name) if self.name else None

    @property
    def platform(self) -> str | None:
        """Qualified name of the vLLM platform class this backend runs on."""
        return self.entry.platform if self.entry else None


def _x86(cpu: CpuInfo) -> tuple[bool, str]:
    return cpu.arch == "x86_64", f"{cpu.arch} CPU; the backends are x86-64 only"


def choose_backend(cpu: CpuInfo, software: SoftwareFacts, requested: str = "auto") -> BackendChoice:
    arch_ok, arch_why = _x86(cpu)
    if not arch_ok:
        return BackendChoice(None, arch_why, requested, error=f"unsupported machine: {arch_why}")
    verdicts = {name: b.check(cpu, software) for name, b in BACKENDS.items()}
    best = next((name for name in ORDER if verdicts[name][0]), None)
    if best is None:
        why = verdicts[ORDER[-1]][1]
        return BackendChoice(None, why, requested, error=f"unsupported machine: {why}")
    if requested == "auto":
        return BackendChoice(best, _auto_reason(best, verdicts), requested)
    if requested == best:
        return BackendChoice(best, f"requested and available: {verdicts[best][1]}", requested)
    lowerings = BACKENDS[best].lowers_to
    if not verdicts[requested][0]:
        error = f"backend '{requested}' was requested but this machine cannot run it: {verdicts[requested][1]}"
    elif requested in lowerings:
        return BackendChoice(requested, f"{LOWERING_REASON}; {verdicts[requested][1]}", requested)
    else:
        error = (
            f"backend '{requested}' was requested but vLLM would run '{best}' on this CPU "
            f"({verdicts[best][1]}); vLLM picks its kernel build from the CPU, so a lower one cannot be forced. "
            f"Use backend: auto or '{best}'" + "".join(f" or '{low}'" for low in sorted(lowerings))
        )
    return BackendChoice(None, error, requested, error=error)


def _auto_reason(best: str, verdicts: dict[str, tuple[bool, str]]) -> str:
    skipped = [f"not {name}: {verdicts[name][1]}" for name in ORDER[: ORDER.index(best)]]
    return "; ".join([verdicts[best][1], *skipped])
