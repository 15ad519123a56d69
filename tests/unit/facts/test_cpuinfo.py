from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from service.facts.cpu import FROM_ARCHSPEC, FROM_BOTH, FROM_TABLE, PARTS, Isa, find_part, parse_cpuinfo, read_cpuinfo

CPUINFO = Path(__file__).parents[2] / "fixtures" / "cpuinfo"

NO_AVX512 = Isa(avx2=True)
AVX512_VNNI = Isa(avx2=True, avx512=True, avx512_vnni=True)
AVX512_BF16 = Isa(avx2=True, avx512=True, avx512_vnni=True, avx512_bf16=True)
AMX = Isa(avx2=True, avx512=True, avx512_vnni=True, avx512_bf16=True, amx_tile=True, amx_bf16=True, amx_int8=True)
# The same, with AVX-VNNI (Zen 5, Sapphire Rapids on, Alder Lake): Isa.vnni's other flag
AVX2_VNNI = replace(NO_AVX512, avx_vnni=True)
AVX512_BF16_VNNI = replace(AVX512_BF16, avx_vnni=True)
AMX_VNNI = replace(AMX, avx_vnni=True)

# fixture -> (vendor, family, model, microarchitecture, which source named it, isa, logical CPUs)
X86 = {
    "epyc_7763_zen3": ("AuthenticAMD", 25, 1, "zen3", FROM_ARCHSPEC, NO_AVX512, 16),
    "epyc_9654_zen4": ("AuthenticAMD", 25, 17, "zen4", FROM_ARCHSPEC, AVX512_BF16, 16),
    "epyc_9755_zen5": ("AuthenticAMD", 26, 2, "zen5", FROM_ARCHSPEC, AVX512_BF16_VNNI, 16),
    # KVM guest: archspec says x86_64_v4 (pku, flush_l1d, tsc_adjust, movdiri hidden)
    "epyc_zen5_kvm": ("AuthenticAMD", 26, 2, "zen5", FROM_TABLE, AVX512_BF16_VNNI, 2),
    # verbatim: a KVM guest of a Zen 4 EPYC (Genoa); archspec says x86_64_v4
    "epyc_zen4_kvm": ("AuthenticAMD", 25, 17, "zen4", FROM_TABLE, AVX512_BF16, 2),
    "xeon_8280_cascadelake": ("GenuineIntel", 6, 85, "cascadelake", FROM_ARCHSPEC, AVX512_VNNI, 16),
    "xeon_8380_icelake": ("GenuineIntel", 6, 106, "icelake", FROM_ARCHSPEC, AVX512_VNNI, 32),
    "xeon_8480_sapphirerapids": ("GenuineIntel", 6, 143, "sapphirerapids", FROM_ARCHSPEC, AMX_VNNI, 16),
    # archspec 0.2.7 has no name for these: it says sapphirerapids
    "xeon_8592_emeraldrapids": ("GenuineIntel", 6, 207, "emeraldrapids", FROM_BOTH, AMX_VNNI, 16),
    "xeon_6980p_graniterapids": ("GenuineIntel", 6, 173, "graniterapids", FROM_BOTH, AMX_VNNI, 16),
    # this build VM (KVM guest, AMX and waitpkg hidden): archspec says icelake
    "xeon_emeraldrapids_kvm_noamx": ("GenuineIntel", 6, 207, "emeraldrapids", FROM_BOTH, AVX512_BF16_VNNI, 2),
    # verbatim: a KVM guest of a first-generation EPYC (Naples), AVX2 only
    "epyc_zen1_kvm_avx2": ("AuthenticAMD", 23, 1, "zen", FROM_ARCHSPEC, NO_AVX512, 2),
    "core_i7_12700k_alderlake": ("GenuineIntel", 6, 151, "alderlake", FROM_ARCHSPEC, AVX2_VNNI, 20),
    # a guest whose model number (167, Rocket Lake) contradicts its flags (AMX): the flags win
    "build_machine": ("GenuineIntel", 6, 167, "icelake", FROM_ARCHSPEC, AMX_VNNI, 2),
}
ARM = {
    "graviton3_neoverse_v1": ("0xd40", "neoverse_v1", 8),
    "ampere_altra_neoverse_n1": ("0xd0c", "neoverse_n1", 4),
}


@pytest.mark.parametrize("name", X86)
def test_x86_fixtures(name: str) -> None:
    vendor, family, model, uarch, source, isa, count = X86[name]
    info = read_cpuinfo(CPUINFO / f"{name}.txt")
    assert (info.arch, info.vendor, info.family, info.model) == ("x86_64", vendor, family, model)
    assert (info.microarchitecture, info.microarchitecture_source) == (uarch, source)
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


def test_x86_blocks_keep_socket_and_core_ids() -> None:
    info = read_cpuinfo(CPUINFO / "xeon_8380_icelake.txt")
    cpu17 = info.cpus[17]  # second thread of socket 0, core 1
    assert (cpu17.processor, cpu17.physical_id, cpu17.core_id) == (17, 0, 1)
    assert info.cpus[9].physical_id == 1


def _first_block(name: str) -> str:
    return (CPUINFO / f"{name}.txt").read_text().split("\n\n")[0]


def _with_flags(
    name: str,
    *,
    drop: set[str] = frozenset(),
    add: set[str] = frozenset(),
    model: int | None = None,
    stepping: int | None = None,
) -> str:
    lines = []
    for line in _first_block(name).splitlines():
        key = line.partition(":")[0].strip()
        if key == "flags":
            line = " ".join([*(w for w in line.split(" ") if w not in drop), *sorted(add)])
        elif key == "model" and model is not None:
            line = f"model\t\t: {model}"
        elif key == "stepping" and stepping is not None:
            line = f"stepping\t: {stepping}"
        lines.append(line)
    return "\n".join(lines)


def test_a_guest_that_hides_amx_is_named_by_its_model_number() -> None:
    # Emerald Rapids under a hypervisor that masks AMX and waitpkg: archspec's flags reach icelake only,
    # the family/model table names the part; the ISA (what backends use) stays what the guest can run.
    info = parse_cpuinfo(_with_flags("xeon_8592_emeraldrapids", drop={"amx_tile", "amx_bf16", "amx_int8", "waitpkg"}))
    assert (info.microarchitecture, info.microarchitecture_source) == ("emeraldrapids", FROM_BOTH)
    assert not info.isa.amx_tile and info.isa.avx512_bf16


def test_emerald_rapids_flags_without_its_model_number_are_sapphire_rapids() -> None:
    info = parse_cpuinfo(_with_flags("xeon_8592_emeraldrapids", model=143))
    assert (info.microarchitecture, info.microarchitecture_source) == ("sapphirerapids", FROM_ARCHSPEC)


def test_an_unknown_model_number_keeps_archspecs_generic_answer() -> None:
    info = parse_cpuinfo(_with_flags("epyc_zen5_kvm", model=0x3F))  # a family 0x1A model no table row has
    assert (info.microarchitecture, info.microarchitecture_source) == ("x86_64_v4", FROM_ARCHSPEC)


def test_the_table_never_lowers_archspecs_answer() -> None:
    # Zen 5 flags on a Zen 3 model number: archspec's zen5 is not below zen3, and zen3 has no AVX-512.
    info = parse_cpuinfo(_with_flags("epyc_9755_zen5", model=0x01).replace("cpu family\t: 26", "cpu family\t: 25"))
    assert (info.microarchitecture, info.microarchitecture_source) == ("zen5", FROM_ARCHSPEC)


@pytest.mark.parametrize("hidden", [{"avx512bw"}, {"avx512dq"}, {"avx512vl"}, {"avx512bw", "avx512dq", "avx512vl"}])
def test_avx512_needs_f_bw_dq_and_vl(hidden: set[str]) -> None:
    """torch tests all four before vLLM loads its AVX-512 kernels: AVX-512F alone (a Xeon Phi) is not AVX-512."""
    info = parse_cpuinfo(_with_flags("xeon_8380_icelake", drop=hidden))
    assert "avx512f" in info.flags and not info.isa.avx512 and info.isa.avx2


# What the E-core Xeons add to Alder Lake's flags (Intel's ISA extensions reference; archspec's arrowlake and
# arrowlake_s targets list the same).
CRESTMONT = {"avx_ifma", "avx_ne_convert", "avx_vnni_int8", "cmpccxadd"}
DARKMONT = CRESTMONT | {"avx_vnni_int16", "sha512", "sm3", "sm4"}


@pytest.mark.parametrize(
    ("model", "added", "hidden", "archspec_says", "name"),
    [
        (0xAF, CRESTMONT, set(), "arrowlake", "sierraforest"),
        (0xAF, CRESTMONT, {"waitpkg"}, "skylake", "sierraforest"),  # a guest hiding waitpkg
        (0xDD, DARKMONT, set(), "arrowlake_s", "clearwaterforest"),
    ],
)
def test_e_core_xeons_are_named_by_their_model_number(
    model: int, added: set[str], hidden: set[str], archspec_says: str, name: str
) -> None:
    """archspec names their flags after a client part; the table names the Xeon. No AVX-512: the avx2 backend."""
    unlisted = _with_flags("core_i7_12700k_alderlake", add=added, drop=hidden, model=0x01)  # no row: archspec alone
    assert parse_cpuinfo(unlisted).microarchitecture == archspec_says
    info = parse_cpuinfo(_with_flags("core_i7_12700k_alderlake", add=added, drop=hidden, model=model))
    assert (info.microarchitecture, info.microarchitecture_source) == (name, FROM_BOTH)
    assert info.isa == AVX2_VNNI


@pytest.mark.parametrize(
    ("stepping", "hidden", "name", "source"),
    [
        (4, {"avx512_vnni"}, "skylake_avx512", FROM_ARCHSPEC),  # Skylake-SP has no VNNI: both agree
        (7, set(), "cascadelake", FROM_ARCHSPEC),
        (7, {"avx512_vnni"}, "cascadelake", FROM_BOTH),  # a guest hiding VNNI looks like skylake_avx512
        (11, set(), "cooperlake", FROM_BOTH),  # archspec has no Cooper Lake; it says cascadelake
    ],
)
def test_model_0x55_is_told_apart_by_stepping(stepping: int, hidden: set[str], name: str, source: str) -> None:
    info = parse_cpuinfo(_with_flags("xeon_8280_cascadelake", drop=hidden, stepping=stepping))
    assert (info.microarchitecture, info.microarchitecture_source) == (name, source)


@pytest.mark.parametrize(
    ("vendor", "family", "model", "name"),
    [
        # AMD: Linux arch/x86/kernel/cpu/amd.c bsp_init_amd() ranges, ends included
        ("AuthenticAMD", 0x17, 0x01, "zen"),
        ("AuthenticAMD", 0x17, 0x5F, "zen"),
        ("AuthenticAMD", 0x17, 0x31, "zen2"),
        ("AuthenticAMD", 0x17, 0xA0, "zen2"),
        ("AuthenticAMD", 0x19, 0x01, "zen3"),
        ("AuthenticAMD", 0x19, 0x21, "zen3"),
        ("AuthenticAMD", 0x19, 0x11, "zen4"),
        ("AuthenticAMD", 0x19, 0xA0, "zen4"),
        ("AuthenticAMD", 0x1A, 0x02, "zen5"),
        ("AuthenticAMD", 0x1A, 0x44, "zen5"),
        ("AuthenticAMD", 0x1A, 0x50, "zen6"),
        # Intel family 6: intel-family.h
        ("GenuineIntel", 6, 0x6A, "icelake"),
        ("GenuineIntel", 6, 0x6C, "icelake"),
        ("GenuineIntel", 6, 0x8F, "sapphirerapids"),
        ("GenuineIntel", 6, 0xCF, "emeraldrapids"),
        ("GenuineIntel", 6, 0xAD, "graniterapids"),
        ("GenuineIntel", 6, 0xAE, "graniterapids"),
        ("GenuineIntel", 6, 0x97, "alderlake"),
        ("GenuineIntel", 6, 0xB7, "raptorlake"),
        ("GenuineIntel", 6, 0x9E, "skylake"),
        ("GenuineIntel", 6, 0xA7, "rocketlake"),
    ],
)
def test_family_model_table(vendor: str, family: int, model: int, name: str) -> None:
    part = find_part(vendor, family, model)
    assert part is not None and part.name == name


def test_table_misses() -> None:
    assert find_part("AuthenticAMD", 0x1A, 0x30) is None  # a hole in the Zen 5 ranges
    assert find_part("GenuineIntel", 6, 0x55) is None  # needs the stepping
    assert find_part("GenuineIntel", 19, 0x01) is None  # Diamond Rapids family, not in the table
    assert find_part("ARM", None, None) is None


def test_every_row_is_based_on_an_archspec_target() -> None:
    from archspec.cpu import TARGETS

    assert all(part.base in TARGETS for part in PARTS)
    # a name archspec knows is its own base: the table must not rename archspec's targets
    assert all(part.base == part.name for part in PARTS if part.name in TARGETS)


@pytest.mark.parametrize(
    ("code", "vendor"), [("0x41", "ARM"), ("0xc0", "Ampere"), ("0x48", "HiSilicon"), ("0x99", "0x99")]
)
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


def test_a_flag_missing_on_one_processor_is_left_out_and_named() -> None:
    blocks = (CPUINFO / "epyc_zen4_kvm.txt").read_text().strip().split("\n\n")
    avx512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_bf16", "avx512_vnni"}
    second = "\n".join(
        " ".join(w for w in line.split(" ") if w not in avx512) if line.startswith("flags") else line
        for line in blocks[1].splitlines()
    )
    cpu = parse_cpuinfo(f"{blocks[0]}\n\n{second}\n")
    assert cpu.isa == NO_AVX512
    assert cpu.flags_not_on_every_cpu == avx512
    assert read_cpuinfo(CPUINFO / "epyc_zen4_kvm.txt").flags_not_on_every_cpu == frozenset()


def test_arm_features_missing_on_one_core_are_left_out() -> None:
    blocks = (CPUINFO / "graviton3_neoverse_v1.txt").read_text().strip().split("\n\n")
    last = blocks[-1].replace(" sve ", " ")
    cpu = parse_cpuinfo("\n\n".join([*blocks[:-1], last]))
    assert "sve" not in cpu.flags
    assert cpu.flags_not_on_every_cpu == {"sve"}


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("cpu family", "six", "processor 0: 'cpu family' holds 'six'"),
        ("model", "0x55", "processor 0: 'model' holds '0x55'"),
        ("core id", "", "processor 0: 'core id' holds ''"),
        ("processor", "zero", "a processor line: 'processor' holds 'zero'"),
    ],
)
def test_a_number_field_that_does_not_parse_is_named(field: str, value: str, named: str) -> None:
    text = "\n".join(
        f"{field}\t: {value}" if line.partition(":")[0].strip() == field else line
        for line in _first_block("epyc_zen4_kvm").splitlines()
    )
    with pytest.raises(ValueError, match=named):
        parse_cpuinfo(text)


def test_a_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    dump = tmp_path / "cpuinfo"
    dump.write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match=f"{dump}: 'utf-8' codec"):
        read_cpuinfo(dump)
