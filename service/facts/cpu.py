"""/proc/cpuinfo -> vendor, model name, family/model, flags, ISA, microarchitecture."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from archspec.cpu import TARGETS, Microarchitecture
from archspec.cpu.detect import AARCH64, X86_64, compatibility_check_for_x86_64, partial_uarch
from archspec.cpu.schema import TARGETS_JSON

# Implementer codes -> vendor names (0x41 "ARM", 0xc0 "Ampere", ...), archspec's own table.
_ARM_VENDORS: dict[str, str] = TARGETS_JSON["conversions"]["arm_vendors"]


@dataclass(frozen=True)
class Isa:
    """Instruction-set features that decide the backend."""

    avx2: bool = False
    avx512: bool = False  # AVX-512F
    avx512_bf16: bool = False
    avx512_vnni: bool = False
    amx_tile: bool = False
    amx_bf16: bool = False
    amx_int8: bool = False

    @property
    def amx(self) -> bool:
        """AMX usable for bf16 matmuls: the tile unit plus its bf16 instructions."""
        return self.amx_tile and self.amx_bf16

    @property
    def native_bf16(self) -> bool:
        return self.avx512_bf16 or self.amx_bf16


@dataclass(frozen=True)
class LogicalCpu:
    """One `processor` block of /proc/cpuinfo (x86 has physical id/core id; Arm usually not)."""

    processor: int
    physical_id: int | None = None
    core_id: int | None = None


@dataclass(frozen=True)
class CpuInfo:
    arch: str  # "x86_64" | "aarch64" | ...
    vendor: str  # "GenuineIntel" | "AuthenticAMD" | "ARM" | implementer name
    model_name: str
    family: int | None
    model: int | None
    flags: frozenset[str]
    microarchitecture: str  # archspec name, e.g. "zen4", "sapphirerapids", "neoverse_v1"
    isa: Isa
    cpus: tuple[LogicalCpu, ...] = field(default_factory=tuple)
    cpu_part: str | None = None  # aarch64 "CPU part", e.g. "0xd40" (Neoverse V1); None on x86


# Names for real CPUs that archspec (0.2.7) folds into an older target because their feature
# flags are the same. Keyed by (vendor, family, model); a name only replaces archspec's answer
# when archspec found the `base` target, so a guest whose hypervisor hides features keeps the
# (lower) name its flags support.
@dataclass(frozen=True)
class _Refinement:
    base: str
    name: str


_REFINEMENTS: dict[tuple[str, int, int], _Refinement] = {
    ("GenuineIntel", 6, 207): _Refinement(base="sapphirerapids", name="emeraldrapids"),  # 5th gen Xeon
    ("GenuineIntel", 6, 173): _Refinement(base="sapphirerapids", name="graniterapids"),  # Xeon 6 P-core
    ("GenuineIntel", 6, 174): _Refinement(base="sapphirerapids", name="graniterapids"),  # Xeon 6 SoC (-D)
}

_ISA_FLAGS = {
    "avx2": "avx2",
    "avx512": "avx512f",
    "avx512_bf16": "avx512_bf16",
    "avx512_vnni": "avx512_vnni",
    "amx_tile": "amx_tile",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
}


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse the text of /proc/cpuinfo (x86-64 or aarch64 format)."""
    blocks = [block for block in _blocks(text) if "processor" in block]
    if not blocks:
        raise ValueError("no 'processor' entries in cpuinfo text: is this a /proc/cpuinfo dump?")
    first = blocks[0]
    arch = _arch(first)
    vendor, model_name, flags = _aarch64_identity(first) if arch == AARCH64 else _x86_identity(first)
    family, model, cpu_part = _int_field(first, "cpu family"), _int_field(first, "model"), first.get("CPU part")
    uarch = _microarchitecture(arch, partial_uarch(vendor=vendor, features=set(flags), cpu_part=cpu_part or ""))
    return CpuInfo(
        arch=arch,
        vendor=vendor,
        model_name=model_name,
        family=family,
        model=model,
        flags=flags,
        microarchitecture=_refine(uarch, vendor, family, model),
        isa=Isa(**{field_name: flag in flags for field_name, flag in _ISA_FLAGS.items()}),
        cpus=tuple(_logical_cpu(block) for block in blocks),
        cpu_part=cpu_part,
    )


def read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    return parse_cpuinfo(Path(path).read_text())


def _blocks(text: str) -> list[dict[str, str]]:
    """Blank-line separated "key : value" blocks."""
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if blocks[-1]:
                blocks.append({})
            continue
        blocks[-1][key.strip()] = value.strip()
    return blocks


def _arch(block: dict[str, str]) -> str:
    # The format tells the architecture; the host running the parser may be another one.
    if "CPU implementer" in block:
        return AARCH64
    if "vendor_id" in block or "flags" in block:
        return X86_64
    raise ValueError(f"unrecognised cpuinfo format (neither x86-64 nor aarch64); fields: {sorted(block)}")


def _x86_identity(block: dict[str, str]) -> tuple[str, str, frozenset[str]]:
    return block.get("vendor_id", "unknown"), block.get("model name", "unknown"), _words(block.get("flags", ""))


def _aarch64_identity(block: dict[str, str]) -> tuple[str, str, frozenset[str]]:
    code = block["CPU implementer"]
    vendor = _ARM_VENDORS.get(code, code)
    # Arm kernels print no model name: name it after implementer and part number.
    model_name = block.get("model name") or f"{vendor} CPU part {block.get('CPU part', 'unknown')}"
    return vendor, model_name, _words(block.get("Features", ""))


def _words(value: str) -> frozenset[str]:
    return frozenset(value.split())


def _int_field(block: dict[str, str], key: str) -> int | None:
    value = block.get(key)
    return int(value) if value is not None else None


def _logical_cpu(block: dict[str, str]) -> LogicalCpu:
    return LogicalCpu(
        processor=int(block["processor"]),
        physical_id=_int_field(block, "physical id"),
        core_id=_int_field(block, "core id"),
    )


def _compatible(arch: str, info: Microarchitecture, target: Microarchitecture) -> bool:
    if arch == X86_64:
        return compatibility_check_for_x86_64(info, target)
    # archspec's aarch64 check asks platform.system() (the host) for a macOS special case;
    # this is its Linux rule, which is what a /proc/cpuinfo text describes.
    root = TARGETS[AARCH64]
    if target.vendor == "generic" and target.name != AARCH64:
        return False
    return (
        root == target.family
        and target.vendor in (info.vendor, "generic")
        and target.features.issubset(info.features)
    )


def _microarchitecture(arch: str, info: Microarchitecture) -> str:
    """archspec.cpu.host()'s selection, applied to the parsed info instead of the host's.

    The featureless root target (x86_64, aarch64) is always a candidate, so `best_generic` exists.
    """
    candidates = [t for t in TARGETS.values() if _compatible(arch, info, t)]

    def depth(target: Microarchitecture) -> tuple[int, int]:
        return len(target.ancestors), len(target.features)

    best_generic = max((c for c in candidates if c.vendor == "generic"), key=depth)
    # Arm parts are recognised by their part number when archspec knows it.
    same_part = [c for c in candidates if info.cpu_part and c.cpu_part == info.cpu_part]
    specific = [c for c in (same_part or candidates) if c > best_generic]
    return max(specific, key=depth).name if specific else best_generic.name


def _refine(name: str, vendor: str, family: int | None, model: int | None) -> str:
    if family is None or model is None:
        return name
    refinement = _REFINEMENTS.get((vendor, family, model))
    return refinement.name if refinement is not None and refinement.base == name else name
