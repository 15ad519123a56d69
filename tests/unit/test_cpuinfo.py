from __future__ import annotations

from pathlib import Path

import pytest

from service.facts.cpu import Isa, parse_cpuinfo, read_cpuinfo

CPUINFO = Path(__file__).parent.parent / "fixtures" / "cpuinfo"

NO_AVX512 = Isa(avx2=True)
AVX512_VNNI = Isa(avx2=True, avx512=True, avx512_vnni=True)
AVX512_BF16 = Isa(avx2=True, avx512=True, avx512_vnni=True, avx512_bf16=True)
AMX = Isa(avx2=True, avx512=True, avx512_vnni=True, avx512_bf16=True, amx_tile=True, amx_bf16=True, amx_int8=True)

# fixture -> (vendor, family, model, microarchitecture, isa, logical CPUs)
X86 = {
    "epyc_7763_zen3": ("AuthenticAMD", 25, 1, "zen3", NO_AVX512, 16),
    "epyc_9654_zen4": ("AuthenticAMD", 25, 17, "zen4", AVX512_BF16, 16),
    "epyc_9755_zen5": ("AuthenticAMD", 26, 2, "zen5", AVX512_BF16, 16),
    "xeon_8280_cascadelake": ("GenuineIntel", 6, 85, "cascadelake", AVX512_VNNI, 16),
    "xeon_8380_icelake": ("GenuineIntel", 6, 106, "icelake", AVX512_VNNI, 32),
    "xeon_8480_sapphirerapids": ("GenuineIntel", 6, 143, "sapphirerapids", AMX, 16),
    "xeon_8592_emeraldrapids": ("GenuineIntel", 6, 207, "emeraldrapids", AMX, 16),
    "xeon_6980p_graniterapids": ("GenuineIntel", 6, 173, "graniterapids", AMX, 16),
    "core_i7_12700k_alderlake": ("GenuineIntel", 6, 151, "alderlake", NO_AVX512, 20),
}
ARM = {
    "graviton3_neoverse_v1": ("0xd40", "neoverse_v1", 8),
    "ampere_altra_neoverse_n1": ("0xd0c", "neoverse_n1", 4),
}


@pytest.mark.parametrize("name", X86)
def test_x86_fixtures(name: str) -> None:
    vendor, family, model, uarch, isa, count = X86[name]
    info = read_cpuinfo(CPUINFO / f"{name}.txt")
    assert (info.arch, info.vendor, info.family, info.model) == ("x86_64", vendor, family, model)
    assert info.microarchitecture == uarch
    assert info.isa == isa
    assert [cpu.processor for cpu in info.cpus] == list(range(count))
    assert info.cpu_part is None
    # "vmx flags" is its own line and must not be mistaken for the flags
    assert "ept_x_only" not in info.flags


@pytest.mark.parametrize("name", ARM)
def test_aarch64_fixtures(name: str) -> None:
    part, uarch, count = ARM[name]
    info = read_cpuinfo(CPUINFO / f"{name}.txt")
    assert (info.arch, info.vendor, info.cpu_part) == ("aarch64", "ARM", part)
    assert info.microarchitecture == uarch
    assert info.model_name == f"ARM CPU part {part}"
    assert (info.family, info.model) == (None, None)
    assert info.isa == Isa()
    assert "asimd" in info.flags
    assert all(cpu.physical_id is None and cpu.core_id is None for cpu in info.cpus)
    assert len(info.cpus) == count


def test_build_machine_recording_parses() -> None:
    info = read_cpuinfo(CPUINFO / "build_machine.txt")
    assert (info.arch, info.vendor, info.family) == ("x86_64", "GenuineIntel", 6)
    assert info.isa.avx512 and info.isa.avx512_vnni


def test_x86_blocks_keep_socket_and_core_ids() -> None:
    info = read_cpuinfo(CPUINFO / "xeon_8380_icelake.txt")
    cpu17 = info.cpus[17]  # second thread of socket 0, core 1
    assert (cpu17.processor, cpu17.physical_id, cpu17.core_id) == (17, 0, 1)
    assert info.cpus[9].physical_id == 1


def _first_block(name: str) -> str:
    return (CPUINFO / f"{name}.txt").read_text().split("\n\n")[0]


def test_a_guest_that_hides_amx_keeps_the_name_its_flags_support() -> None:
    # Emerald Rapids under a hypervisor that masks AMX and waitpkg: no sapphirerapids-level
    # flags, so the family/model table must not call it emeraldrapids.
    hidden = {"amx_tile", "amx_bf16", "amx_int8", "waitpkg"}
    block = "\n".join(
        " ".join(w for w in line.split(" ") if w not in hidden) if line.startswith("flags") else line
        for line in _first_block("xeon_8592_emeraldrapids").splitlines()
    )
    info = parse_cpuinfo(block)
    assert info.microarchitecture == "icelake"
    assert not info.isa.amx_tile and info.isa.avx512_bf16


def test_emerald_rapids_flags_without_its_model_number_are_sapphire_rapids() -> None:
    info = parse_cpuinfo(_first_block("xeon_8592_emeraldrapids").replace("model\t\t: 207", "model\t\t: 143"))
    assert info.microarchitecture == "sapphirerapids"


@pytest.mark.parametrize(("code", "vendor"), [("0x41", "ARM"), ("0xc0", "Ampere"), ("0x48", "HiSilicon"), ("0x99", "0x99")])
def test_arm_implementer_names(code: str, vendor: str) -> None:
    text = f"processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU implementer\t: {code}\nCPU part\t: 0xac3\n"
    info = parse_cpuinfo(text)
    assert info.vendor == vendor
    assert info.model_name == f"{vendor} CPU part 0xac3"
    assert info.microarchitecture == "aarch64"  # too few features for any named Arm core


def test_ampereone_by_features() -> None:
    ampere1_features = (
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
        "dcpop sha3 sm3 sm4 asimddp sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp flagm2 "
        "frint i8mm bf16 rng bti ecv"
    )
    text = f"processor\t: 0\nFeatures\t: {ampere1_features}\nCPU implementer\t: 0xc0\nCPU part\t: 0xac3\n"
    assert parse_cpuinfo(text).microarchitecture == "ampere1"


def test_unknown_text_is_rejected() -> None:
    with pytest.raises(ValueError, match="processor"):
        parse_cpuinfo("hello: world\n")
    with pytest.raises(ValueError, match="unrecognised cpuinfo format"):
        parse_cpuinfo("processor\t: 0\ncpu\t: POWER9\n")
