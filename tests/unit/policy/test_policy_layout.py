"""The policy stays readable: no decision function grows past about 60 lines (build_plan was 178 before the staged
plan); a longer one is split into the steps it takes."""

from __future__ import annotations

import ast
from pathlib import Path

import service.policy

LIMIT = 65


def test_no_function_in_the_policy_is_longer_than_about_60_lines():
    long = []
    for path in Path(service.policy.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.name}:{node.name} ({lines} lines)")
    assert long == []


def test_the_policy_is_folders_by_what_they_decide():
    """No module lies loose in service/policy: each sits in the folder of what it decides."""
    root = Path(service.policy.__file__).parent
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py"]
    assert all((d / "__init__.py").is_file() for d in root.iterdir() if d.is_dir() and d.name != "__pycache__")
