"""docs/development.md's recipes stay true: every file a recipe's diff touches exists (a new file's folder does), its
context and removed lines are still in that file, and the recipes applied to a copy of the tree pass the registry
tests of their extension points (a fake CPU family, kernel, decision, route, model source and bench part)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "development.md"
needs_the_guide = pytest.mark.skipif(not GUIDE.is_file(), reason="docs/ is not in this build context (the test image)")


def diff_blocks(text: str) -> list[str]:
    return re.findall(r"```diff\n(.*?)```", text, re.S)


def diff_sections(text: str) -> list[tuple[str, bool, list[str]]]:
    """(path, new file, lines that must be in it) for each file of each ```diff block."""
    sections: list[tuple[str, bool, list[str]]] = []
    for block in diff_blocks(text):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("+++ b/"):
                new = lines[i - 1] == "--- /dev/null"
                body = []
                for rest in lines[i + 1 :]:
                    if rest.startswith(("--- ", "+++ ")):
                        break
                    if rest.startswith((" ", "-")):
                        body.append(rest[1:])
                sections.append((line.removeprefix("+++ b/"), new, body))
    return sections


def stale(text: str, root: Path = ROOT) -> list[str]:
    found = []
    for path, new, body in diff_sections(text):
        target = root / path
        if new:
            if not target.parent.is_dir():
                found.append(f"{path}: its folder does not exist")
            continue
        if not target.is_file():
            found.append(f"{path}: no such file")
            continue
        have = set(target.read_text().splitlines())
        found += [f"{path}: {line!r} is not in it" for line in body if line not in have]
    return found


@needs_the_guide
def test_every_recipe_diff_applies_to_the_tree():
    text = GUIDE.read_text()
    assert len(diff_sections(text)) >= 10
    assert stale(text) == []


def test_a_recipe_that_went_stale_is_caught():
    gone = '```diff\n--- a/service/policy/plan/plan.py\n+++ b/service/policy/plan/plan.py\n     Stage("no such", x),\n```\n'
    missing = "```diff\n--- a/service/policy/nothing.py\n+++ b/service/policy/nothing.py\n+x = 1\n```\n"
    nowhere = "```diff\n--- /dev/null\n+++ b/service/nowhere/new.py\n+x = 1\n```\n"
    assert len(stale(gone)) == 1 and len(stale(missing)) == 1 and len(stale(nowhere)) == 1


def apply_block(block: str, root: Path) -> None:
    """A recipe's diff applied as `patch` would, without line numbers: a new file is its + lines; a file that exists
    takes each hunk (hunks of a file are separated by `@@` lines) where its first context or removed line is next
    found, its lines then following each other as in a unified diff. Raises ValueError where a line is not found."""
    lines = block.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("+++ b/"):
            continue
        body = []
        for rest in lines[i + 1 :]:
            if rest.startswith(("--- ", "+++ ")):
                break
            body.append(rest)
        target = root / line.removeprefix("+++ b/")
        if lines[i - 1] == "--- /dev/null":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(b[1:] for b in body if b.startswith("+")) + "\n")
        else:
            target.write_text("\n".join(_apply_hunks(target.read_text().splitlines(), body)) + "\n")


def _apply_hunks(have: list[str], body: list[str]) -> list[str]:
    hunks: list[list[str]] = [[]]
    for b in body:
        if b.startswith("@@"):
            hunks.append([])
        else:
            hunks[-1].append(b)
    out: list[str] = []
    at = 0  # lines of `have` consumed
    for hunk in filter(None, hunks):
        anchor = next((b[1:] for b in hunk if not b.startswith("+")), None)
        if anchor is None:
            raise ValueError(f"a hunk with no context line: {hunk[0]!r}")
        found = have.index(anchor, at)
        out += have[at:found]
        at = found
        for b in hunk:
            kind, text = b[:1], b[1:]
            if kind == "+":
                out.append(text)
                continue
            if at >= len(have) or have[at] != text:
                raise ValueError(f"{text!r} does not follow where the hunk is")
            if kind == " ":
                out.append(text)
            at += 1
    return out + have[at:]


# The registry tests of each extension point: the recipes' examples must pass them.
REGISTRY_TESTS = (
    "tests/unit/policy/test_backends.py",
    "tests/unit/policy/test_stages.py",
    "tests/unit/kernels/test_kernel_registry.py",
    "tests/unit/server/test_route_table.py",
    "tests/unit/models/test_model_choice.py",
    "tests/unit/bench/test_bench_parts.py",
    "tests/unit/in_vllm/test_contract.py",
)


@needs_the_guide
def test_the_recipes_applied_to_a_copy_pass_the_registry_tests(tmp_path):
    """Every recipe applied to one copy of the tree (service, bench, harness, tests), then the registry tests run
    there: a recipe that no longer applies, or whose example a registry refuses, fails here."""
    for name in ("service", "bench", "harness", "tests", "configs"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    blocks = diff_blocks(GUIDE.read_text())
    for block in blocks:
        apply_block(block, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")} | {"PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *REGISTRY_TESTS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "passed" in run.stdout


def test_a_recipe_is_applied_as_written(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/table.py").write_text("A = 1\nTABLE = (\n    1,\n)\nOLD = 2\n")
    block = (
        "--- a/pkg/table.py\n+++ b/pkg/table.py\n TABLE = (\n+    2,\n@@\n-OLD = 2\n+NEW = 3\n"
        "--- /dev/null\n+++ b/pkg/new.py\n+X = 1\n"
    )
    apply_block(block, tmp_path)
    assert (tmp_path / "pkg/table.py").read_text() == "A = 1\nTABLE = (\n    2,\n    1,\n)\nNEW = 3\n"
    assert (tmp_path / "pkg/new.py").read_text() == "X = 1\n"
    with pytest.raises(ValueError):
        apply_block("--- a/pkg/new.py\n+++ b/pkg/new.py\n Y = 2\n+Z = 3\n", tmp_path)
