"""Which CPU backend runs the engine: zen | amx | avx512 | avx2, or a refusal that says why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.facts.cpu import CpuInfo
from service.facts.software import SoftwareFacts

# Best first. vLLM picks its kernel build from the CPU itself (the _C build with AMX/AVX-512 BF16, else
# _C_AVX512, else _C_AVX2): the service can confirm that part but never force it lower. The platform class
# is the one thing it can choose, through its vLLM platform plugin (service/vllm_plugin.py).
ORDER = ("zen", "amx", "avx512", "avx2")

ZEN_PLATFORM = "vllm.platforms.zen_cpu.ZenCpuPlatform"
GENERIC_PLATFORM = "vllm.platforms.cpu.CpuPlatform"
# The vLLM platform class each backend runs on.
PLATFORMS = {"zen": ZEN_PLATFORM, "amx": GENERIC_PLATFORM, "avx512": GENERIC_PLATFORM, "avx2": GENERIC_PLATFORM}
# (best, requested) pairs the platform plugin can enforce: on a Zen host, vLLM's generic CpuPlatform runs the
# same AVX-512 kernel build vLLM would pick without zentorch.
LOWERINGS = {("zen", "avx512")}
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

    @property
    def platform(self) -> str | None:
        """Qualified name of the vLLM platform class this backend runs on."""
        return PLATFORMS.get(self.name) if self.name else None


Check = Callable[[CpuInfo, SoftwareFacts], tuple[bool, str]]


def _x86(cpu: CpuInfo) -> tuple[bool, str]:
    return cpu.arch == "x86_64", f"{cpu.arch} CPU; the backends are x86-64 only"


def _zen(cpu: CpuInfo, sw: SoftwareFacts) -> tuple[bool, str]:
    if cpu.vendor != "AuthenticAMD":
        return False, f"Zen acceleration (zentorch) needs an AMD CPU; this one is {cpu.vendor}"
    if not cpu.isa.avx512:
        return False, f"Zen acceleration needs AVX-512 (Zen 4 or later); {cpu.microarchitecture} has none"
    if not sw.zentorch_usable:
        return False, f"AMD {cpu.microarchitecture} with AVX-512, but {sw.zentorch_reason}"
    return True, f"AMD {cpu.microarchitecture} with AVX-512 and {sw.zentorch_reason}: vLLM uses ZenCpuPlatform"


def _amx(cpu: CpuInfo, sw: SoftwareFacts) -> tuple[bool, str]:
    if cpu.isa.amx:
        return True, f"{cpu.microarchitecture} has AMX (amx_tile + amx_bf16): vLLM's AMX/AVX-512 BF16 kernels"
    return False, "no AMX (amx_tile and amx_bf16 not both in the CPU flags)"


def _avx512(cpu: CpuInfo, sw: SoftwareFacts) -> tuple[bool, str]:
    if cpu.isa.avx512:
        bf16 = "with" if cpu.isa.avx512_bf16 else "without"
        return True, f"{cpu.microarchitecture} has AVX-512F ({bf16} AVX-512 BF16): vLLM's AVX-512 kernels"
    return False, "no AVX-512F in the CPU flags"


def _avx2(cpu: CpuInfo, sw: SoftwareFacts) -> tuple[bool, str]:
    if cpu.isa.avx2:
        return True, f"{cpu.microarchitecture} has AVX2 but no AVX-512: vLLM's AVX2 kernels"
    return False, "no AVX2: vLLM's CPU kernels need at least AVX2 and would die with SIGILL"


CHECKS: dict[str, Check] = {"zen": _zen, "amx": _amx, "avx512": _avx512, "avx2": _avx2}


def choose_backend(cpu: CpuInfo, software: SoftwareFacts, requested: str = "auto") -> BackendChoice:
    arch_ok, arch_why = _x86(cpu)
    if not arch_ok:
        return BackendChoice(None, arch_why, requested, error=f"unsupported machine: {arch_why}")
    verdicts = {name: CHECKS[name](cpu, software) for name in ORDER}
    best = next((name for name in ORDER if verdicts[name][0]), None)
    if best is None:
        why = verdicts["avx2"][1]
        return BackendChoice(None, why, requested, error=f"unsupported machine: {why}")
    if requested == "auto":
        return BackendChoice(best, _auto_reason(best, verdicts), requested)
    if requested == best:
        return BackendChoice(best, f"requested and available: {verdicts[best][1]}", requested)
    if not verdicts[requested][0]:
        error = f"backend '{requested}' was requested but this machine cannot run it: {verdicts[requested][1]}"
    elif (best, requested) in LOWERINGS:
        return BackendChoice(requested, f"{LOWERING_REASON}; {verdicts[requested][1]}", requested)
    else:
        allowed = sorted(low for top, low in LOWERINGS if top == best)
        error = (
            f"backend '{requested}' was requested but vLLM would run '{best}' on this CPU "
            f"({verdicts[best][1]}); vLLM picks its kernel build from the CPU, so a lower one cannot be forced. "
            f"Use backend: auto or '{best}'" + "".join(f" or '{low}'" for low in allowed)
        )
    return BackendChoice(None, error, requested, error=error)


def _auto_reason(best: str, verdicts: dict[str, tuple[bool, str]]) -> str:
    skipped = [f"not {name}: {verdicts[name][1]}" for name in ORDER[: ORDER.index(best)]]
    return "; ".join([verdicts[best][1], *skipped])
