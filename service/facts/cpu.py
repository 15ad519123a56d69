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
    avx512: bool = False  # AVX-512 F, BW, DQ and VL: torch's test before vLLM loads its AVX-512 kernels
    avx512_bf16: bool = False
    avx512_vnni: bool = False
    amx_tile: bool = False
    amx_bf16: bool = False
    amx_int8: bool = False
    # AVX-VNNI (VEX): not a backend's flag, but int8 dot products that accumulate in int32 as AVX-512 VNNI's do
    avx_vnni: bool = False

    @property
    def vnni(self) -> bool:
        """int8 dot products accumulate in int32. Without, x86 int8 GEMMs (oneDNN's) multiply through vpmaddubsw,
        whose adjacent-pair sums saturate at int16 on full-range int8 weights."""
        return self.avx512_vnni or self.avx_vnni or self.amx_int8

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
    microarchitecture: str  # e.g. "zen5", "emeraldrapids", "neoverse_v1": for people; backends follow `isa`
    isa: Isa
    cpus: tuple[LogicalCpu, ...] = field(default_factory=tuple)
    cpu_part: str | None = None  # aarch64 "CPU part", e.g. "0xd40" (Neoverse V1); None on x86
    stepping: int | None = None
    microarchitecture_source: str = "archspec"  # FROM_ARCHSPEC | FROM_TABLE | FROM_BOTH
    # Flags some processors show and others do not (a hypervisor or hybrid part that differs per CPU): left out
    # of `flags`, since the engine's threads may run on any of them.
    flags_not_on_every_cpu: frozenset[str] = frozenset()


# Microarchitecture of a part from its vendor's family/model(/stepping) identification. archspec names a
# CPU from its flags only; a hypervisor masks flags (a Zen 5 KVM guest is only `x86_64_v4`, an Emerald Rapids
# guest without AMX and waitpkg only `icelake`), and archspec 0.2.7 has no name for some parts whose flags
# equal an older one's (Emerald/Granite Rapids look like sapphirerapids). The family/model numbers survive.
#
# Sources (numbers copied, not guessed):
# - AMD: Linux arch/x86/kernel/cpu/amd.c, bsp_init_amd() "Figure out Zen generations" (X86_FEATURE_ZEN1..ZEN6
#   model ranges, as of the Oct 2025 "Extend Zen6 model range" commit); family 0x1A is Zen 5 / Zen 6.
# - Intel family 6 models: Linux arch/x86/include/asm/intel-family.h (INTEL_<NAME> IFM(6, 0x..)).
# - Model 0x55 by stepping: Linux tools/perf/pmu-events/arch/x86/mapfile.csv (GenuineIntel-6-55-[01234]
#   skylakex, -55-[56789ABCDEF] cascadelakex) and intel-family.h's comment "COOPERLAKE_X 0x55 ... s: 11".
# - Parts grouped under one microarchitecture (Kaby/Coffee/Comet Lake = Skylake cores, Rocket Lake with
#   icelake events): the same mapfile.csv.
@dataclass(frozen=True)
class Part:
    """A row of the family/model table."""

    vendor: str
    family: int
    models: tuple[tuple[int, int], ...]  # inclusive model ranges
    name: str  # what the report calls it: archspec's name when archspec has one
    base: str  # the archspec target whose features the part has (the name itself when archspec knows it)
    steppings: tuple[int, int] | None = None  # inclusive; None = any
    adds: frozenset[str] = frozenset()  # backend ISA flags the part has beyond `base` (Cooper Lake: bf16)


_INTEL, _AMD = "GenuineIntel", "AuthenticAMD"
PARTS: tuple[Part, ...] = (
    Part(_AMD, 0x17, ((0x00, 0x2F), (0x50, 0x5F)), "zen", "zen"),
    Part(_AMD, 0x17, ((0x30, 0x4F), (0x60, 0x7F), (0x90, 0x91), (0xA0, 0xAF)), "zen2", "zen2"),
    Part(_AMD, 0x19, ((0x00, 0x0F), (0x20, 0x5F)), "zen3", "zen3"),
    Part(_AMD, 0x19, ((0x10, 0x1F), (0x60, 0xAF)), "zen4", "zen4"),
    Part(_AMD, 0x1A, ((0x00, 0x2F), (0x40, 0x4F), (0x60, 0x7F)), "zen5", "zen5"),
    Part(_AMD, 0x1A, ((0x50, 0x5F), (0x80, 0xAF), (0xC0, 0xCF)), "zen6", "zen6"),
    # Server
    Part(_INTEL, 6, ((0x55, 0x55),), "skylake_avx512", "skylake_avx512", steppings=(0, 4)),  # SKYLAKE_X
    Part(_INTEL, 6, ((0x55, 0x55),), "cooperlake", "cascadelake", steppings=(11, 11), adds=frozenset({"avx512_bf16"})),
    Part(_INTEL, 6, ((0x55, 0x55),), "cascadelake", "cascadelake", steppings=(5, 15)),
    Part(_INTEL, 6, ((0x6A, 0x6A), (0x6C, 0x6C)), "icelake", "icelake"),  # ICELAKE_X, ICELAKE_D
    Part(_INTEL, 6, ((0x8F, 0x8F),), "sapphirerapids", "sapphirerapids"),  # SAPPHIRERAPIDS_X
    Part(_INTEL, 6, ((0xCF, 0xCF),), "emeraldrapids", "sapphirerapids"),  # EMERALDRAPIDS_X
    Part(_INTEL, 6, ((0xAD, 0xAE),), "graniterapids", "sapphirerapids"),  # GRANITERAPIDS_X, _D
    # E-core Xeons (AVX2, no AVX-512): archspec names their flags after the client parts with the same ISA.
    Part(_INTEL, 6, ((0xAF, 0xAF),), "sierraforest", "arrowlake"),  # ATOM_CRESTMONT_X (Xeon 6 E-cores)
    Part(_INTEL, 6, ((0xDD, 0xDD),), "clearwaterforest", "arrowlake_s"),  # ATOM_DARKMONT_X
    # Client
    Part(_INTEL, 6, ((0x4E, 0x4E), (0x5E, 0x5E), (0x8E, 0x8E), (0x9E, 0x9E), (0xA5, 0xA6)), "skylake", "skylake"),
    Part(_INTEL, 6, ((0x7D, 0x7E),), "icelake", "icelake"),  # ICELAKE, ICELAKE_L
    Part(_INTEL, 6, ((0xA7, 0xA7),), "rocketlake", "icelake"),  # ROCKETLAKE (Cypress Cove)
    Part(_INTEL, 6, ((0x8C, 0x8D),), "tigerlake", "icelake"),  # TIGERLAKE_L, TIGERLAKE (Willow Cove)
    Part(_INTEL, 6, ((0x97, 0x97), (0x9A, 0x9A)), "alderlake", "alderlake"),  # ALDERLAKE, ALDERLAKE_L
    Part(_INTEL, 6, ((0xB7, 0xB7), (0xBA, 0xBA), (0xBF, 0xBF)), "raptorlake", "alderlake"),  # RAPTORLAKE{,_P,_S}
    Part(_INTEL, 6, ((0xAA, 0xAA), (0xAC, 0xAC)), "meteorlake", "alderlake"),  # METEORLAKE{_L,}
)

# Which source named the microarchitecture (CpuInfo.microarchitecture_source).
FROM_ARCHSPEC = "archspec"
FROM_TABLE = "family/model table"  # archspec found only a generic x86-64 level
FROM_BOTH = "archspec + family/model"  # archspec's vendor target, raised or made specific by the table


def find_part(vendor: str, family: int | None, model: int | None, stepping: int | None = None) -> Part | None:
    """The table's row for a family/model(/stepping), or None."""
    for part in PARTS:
        if (part.vendor, part.family) != (vendor, family) or model is None:
            continue
        if not any(low <= model <= high for low, high in part.models):
            continue
        if part.steppings is None or (stepping is not None and part.steppings[0] <= stepping <= part.steppings[1]):
            return part
    return None


def part_contradicted(part: Part, flags: frozenset[str]) -> set[str]:
    """Backend ISA flags the guest shows that the named part does not have.

    A hypervisor can hide features but cannot add them: a guest showing AMX on a "Rocket Lake" model
    number (the recorded build VM, model 167) runs on another part, so the flags win. Only the backend ISA
    flags are compared: archspec's feature lists are curated subsets and cannot tell what a part lacks.
    """
    known = TARGETS[part.base].features | part.adds
    return {flag for needed in _ISA_FLAGS.values() for flag in needed if flag in flags and flag not in known}


# Each Isa field and the flags it needs. torch.cpu._is_avx512_supported(), which decides whether vLLM loads its
# AVX-512 or its AVX2 kernels, asks for F, BW, DQ and VL: a Xeon Phi's AVX-512F alone gets the AVX2 ones.
_ISA_FLAGS: dict[str, frozenset[str]] = {
    "avx2": frozenset({"avx2"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"}),
    "avx512_bf16": frozenset({"avx512_bf16"}),
    "avx512_vnni": frozenset({"avx512_vnni"}),
    "amx_tile": frozenset({"amx_tile"}),
    "amx_bf16": frozenset({"amx_bf16"}),
    "amx_int8": frozenset({"amx_int8"}),
}


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse the text of /proc/cpuinfo (x86-64 or aarch64 format)."""
    blocks = [block for block in _blocks(text) if "processor" in block]
    if not blocks:
        raise ValueError("no 'processor' entries in cpuinfo text: is this a /proc/cpuinfo dump?")
    first = blocks[0]
    arch = _arch(first)
    vendor, model_name = _aarch64_identity(first) if arch == AARCH64 else _x86_identity(first)
    per_cpu = [_words(block.get("Features" if arch == AARCH64 else "flags", "")) for block in blocks]
    flags = frozenset.intersection(*per_cpu)
    family, model, cpu_part = _int_field(first, "cpu family"), _int_field(first, "model"), first.get("CPU part")
    stepping = _int_field(first, "stepping")
    uarch = _microarchitecture(arch, partial_uarch(vendor=vendor, features=set(flags), cpu_part=cpu_part or ""))
    name, source = _name(uarch, find_part(vendor, family, model, stepping), flags)
    return CpuInfo(
        arch=arch,
        vendor=vendor,
        model_name=model_name,
        family=family,
        model=model,
        flags=flags,
        microarchitecture=name,
        isa=Isa(
            **{field_name: needed <= flags for field_name, needed in _ISA_FLAGS.items()}, avx_vnni="avx_vnni" in flags
        ),
        cpus=tuple(_logical_cpu(block) for block in blocks),
        cpu_part=cpu_part,
        stepping=stepping,
        microarchitecture_source=source,
        flags_not_on_every_cpu=frozenset.union(*per_cpu) - flags,
    )


def read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    try:
        return parse_cpuinfo(Path(path).read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


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
        return str(AARCH64)
    if "vendor_id" in block or "flags" in block:
        return str(X86_64)
    raise ValueError(f"unrecognised cpuinfo format (neither x86-64 nor aarch64); fields: {sorted(block)}")


def _x86_identity(block: dict[str, str]) -> tuple[str, str]:
    return block.get("vendor_id", "unknown"), block.get("model name", "unknown")


def _aarch64_identity(block: dict[str, str]) -> tuple[str, str]:
    code = block["CPU implementer"]
    vendor = _ARM_VENDORS.get(code, code)
    # Arm kernels print no model name: name it after implementer and part number.
    return vendor, block.get("model name") or f"{vendor} CPU part {block.get('CPU part', 'unknown')}"


def _words(value: str) -> frozenset[str]:
    return frozenset(value.split())


def _int_field(block: dict[str, str], key: str) -> int | None:
    value = block.get(key)
    return None if value is None else _whole(block, key, value)


def _whole(block: dict[str, str], key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        where = "a processor line" if key == "processor" else f"processor {block['processor']}"
        raise ValueError(f"{where}: {key!r} holds {value!r}, not a whole number") from None


def _logical_cpu(block: dict[str, str]) -> LogicalCpu:
    return LogicalCpu(
        processor=_whole(block, "processor", block["processor"]),
        physical_id=_int_field(block, "physical id"),
        core_id=_int_field(block, "core id"),
    )


def _compatible(arch: str, info: Microarchitecture, target: Microarchitecture) -> bool:
    if arch == X86_64:
        return bool(compatibility_check_for_x86_64(info, target))
    # archspec's aarch64 check asks platform.system() (the host) for a macOS special case;
    # this is its Linux rule, which is what a /proc/cpuinfo text describes.
    root = TARGETS[AARCH64]
    if target.vendor == "generic" and target.name != AARCH64:
        return False
    return (
        root == target.family and target.vendor in (info.vendor, "generic") and target.features.issubset(info.features)
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
    return str(max(specific, key=depth).name if specific else best_generic.name)


def _name(archspec_name: str, part: Part | None, flags: frozenset[str]) -> tuple[str, str]:
    """archspec's name unless the family/model table names a part that archspec's answer is below.

    The table wins when archspec found only a generic level (x86_64_v4) or a target the part's own
    target descends from (icelake or sapphirerapids for an Emerald Rapids), and the flags do not
    contradict the part; it never lowers archspec's answer (a Zen 6 in a Zen 5 model range stays zen6).
    """
    if part is None or part.name == archspec_name or part_contradicted(part, flags):
        return archspec_name, FROM_ARCHSPEC
    found = TARGETS[archspec_name]
    if found.vendor == "generic":
        return part.name, FROM_TABLE
    if found <= TARGETS[part.base]:
        return part.name, FROM_BOTH
    return archspec_name, FROM_ARCHSPEC
