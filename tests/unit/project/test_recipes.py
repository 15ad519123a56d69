"""docs/development.md's recipes stay true: every file a recipe's diff touches exists (a new file's folder does),
and its context and removed lines are still in that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "development.md"
needs_the_guide = pytest.mark.skipif(not GUIDE.is_file(), reason="docs/ is not in this build context (the test image)")


def diff_sections(text: str) -> list[tuple[str, bool, list[str]]]:
    """(path, new file, lines that must be in it) for each file of each ```diff block."""
    sections: list[tuple[str, bool, list[str]]] = []
    for block in re.findall(r"```diff\n(.*?)```", text, re.S):
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
    gone = '```diff\n--- a/service/policy/plan.py\n+++ b/service/policy/plan.py\n     Stage("no such", x),\n```\n'
    missing = "```diff\n--- a/service/policy/nothing.py\n+++ b/service/policy/nothing.py\n+x = 1\n```\n"
    nowhere = "```diff\n--- /dev/null\n+++ b/service/nowhere/new.py\n+x = 1\n```\n"
    assert len(stale(gone)) == 1 and len(stale(missing)) == 1 and len(stale(nowhere)) == 1
