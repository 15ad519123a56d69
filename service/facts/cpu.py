"""/proc/cpuinfo -> vendor, model name, family/model, flags, ISA, microarchitecture."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse the text of /proc/cpuinfo (x86-64 or aarch64 format)."""
    raise NotImplementedError


def read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    return parse_cpuinfo(Path(path).read_text())
