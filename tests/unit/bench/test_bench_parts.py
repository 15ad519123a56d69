"""bench/registry.py: one entry per part, and what is derived from it (the CLI, --quick, --only-<part>, the report)."""

from __future__ import annotations

import dataclasses

import pytest

from bench.__main__ import options, parser
from bench.registry import PARTS
from bench.report import markdown
from tests.unit.bench.bench_results import results as recorded


def test_parts_are_named_once_and_keep_their_results_apart():
    assert len({p.name for p in PARTS}) == len(PARTS) and len({p.key for p in PARTS}) == len(PARTS)
    for part in PARTS:
        assert callable(part.run) and callable(part.section)
        assert part.options is None or dataclasses.is_dataclass(part.options)


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.name)
def test_each_part_gets_its_flags_from_the_registry(part):
    flags = {a for action in parser()._actions for a in action.option_strings}
    assert {f"--{part.name}", f"--no-{part.name}", f"--only-{part.name}"} <= flags
    for field in dataclasses.fields(part.options) if part.options else ():
        if field.type in ("int", "float", "str") or str(field.type).startswith("tuple"):
            assert f"--{part.name}-{field.name.replace('_', '-')}" in flags
        if field.type == "bool":
            assert {
                f"--{part.name}-{field.name.replace('_', '-')}",
                f"--no-{part.name}-{field.name.replace('_', '-')}",
            } <= flags
    only = options(parser().parse_args([f"--only-{part.name}"]))
    assert only.parts == {part.name}
    without = options(parser().parse_args([f"--no-{part.name}"]))
    assert part.name not in without.parts and len(without.parts) == len(PARTS) - 1


def test_quick_runs_the_quick_parts_and_a_part_option_reaches_its_part():
    quick = options(parser().parse_args(["--quick"]))
    assert quick.parts == {p.name for p in PARTS if p.quick} and quick.quick and quick.concurrencies == (4,)
    chosen = options(parser().parse_args(["--only-peer", "--peer-format", "q8_0", "--peer-repetitions", "1"]))
    assert chosen.of("peer").format == ("q8_0",) and chosen.of("peer").repetitions == 1
    assert chosen.of("quant") == next(p for p in PARTS if p.name == "quant").defaults()
    assert not chosen.of("peer").speculative_suffix
    assert options(parser().parse_args(["--peer-speculative-suffix"])).of("peer").speculative_suffix
    named = options(parser().parse_args(["--only-peer", "--peer-file", "/models/gemma.Q4_K_M.gguf"]))
    assert named.of("peer").file == "/models/gemma.Q4_K_M.gguf"
    sized = options(parser().parse_args(["--only-peer", "--peer-size", "3b", "--peer-format", "q4_0-gguf"]))
    assert (sized.of("peer").size, sized.of("peer").format) == ("3b", ("q4_0-gguf",))


def test_the_report_shows_a_section_for_each_part_that_ran_and_none_for_one_that_did_not():
    skipped = recorded("python -m bench --only-quality", quality={"skipped": "llama.cpp not built"})
    md = markdown(skipped, [], [])
    assert "Quality: skipped (llama.cpp not built)." in md and "Peer:" not in md
