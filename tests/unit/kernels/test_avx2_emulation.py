"""The AVX2 emulation's CPU (tests/support/avx2_emulation): every recorded CPU, with the flags it hides taken out, reads
as AVX2-only and gets the avx2 backend, whatever it had before; its other facts stay the CPU's."""

from __future__ import annotations

import pytest

from service.facts.cpu import Isa, parse_cpuinfo
from service.policy.machine.backend import choose_backend
from tests.support.avx2_emulation.__main__ import HIDDEN, avx2_cpuinfo
from tests.unit.conftest import CPUINFO, software

X86 = sorted(p.name for p in CPUINFO.glob("*.txt") if " avx2 " in p.read_text())


@pytest.mark.parametrize("name", X86)
@pytest.mark.parametrize("zentorch", [True, False])
def test_every_x86_recording_reads_as_avx2_only_with_its_other_facts(name, zentorch):
    text = (CPUINFO / name).read_text()
    real, emulated = parse_cpuinfo(text), parse_cpuinfo(avx2_cpuinfo(text))
    assert emulated.isa == Isa(avx2=True)
    assert (emulated.vendor, emulated.family, emulated.model) == (real.vendor, real.family, real.model)
    assert len(emulated.cpus) == len(real.cpus)
    assert choose_backend(emulated, software(zentorch)).name == "avx2"


def test_only_the_newer_isas_flags_go():
    text = (CPUINFO / "xeon_8480_sapphirerapids.txt").read_text()
    before, after = parse_cpuinfo(text).flags, parse_cpuinfo(avx2_cpuinfo(text)).flags
    assert before - after == {f for f in before if f.startswith(HIDDEN)}
    assert {"amx_tile", "avx512f", "avx512_bf16"} <= before - after and {"avx2", "fma", "f16c"} <= after
