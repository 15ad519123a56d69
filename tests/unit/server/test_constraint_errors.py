"""constraint_errors: which field a refused output constraint is in, and which refusals are about one."""

from __future__ import annotations

import ast
import inspect
import pathlib
import textwrap
from collections.abc import Iterator

import pytest
import vllm.sampling_params
import vllm.v1.structured_output

from service.server.openai_compat.constraint_errors import constraint_field, constraint_param, is_constraint_refusal

MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
OTHER_TOOL = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}


def _opening(node: ast.expr) -> str | None:
    """The literal text a message starts with (an f-string up to its first placeholder)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    if isinstance(node, ast.BinOp):
        return _opening(node.left)
    return None


def _vllm_constraint_refusals() -> Iterator[str]:
    """The openings of every VLLMValidationError vLLM raises while it validates a request's constraint."""
    sources = [path.read_text() for path in pathlib.Path(vllm.v1.structured_output.__file__).parent.glob("*.py")]
    sources.append(textwrap.dedent(inspect.getsource(vllm.sampling_params.SamplingParams._validate_structured_outputs)))
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Raise)
                and isinstance(node.exc, ast.Call)
                and getattr(node.exc.func, "id", None) == "VLLMValidationError"
                and node.exc.args
            ):
                opening = _opening(node.exc.args[0])
                if opening:
                    yield opening


def test_every_constraint_refusal_vllm_raises_is_recognised():
    openings = sorted(set(_vllm_constraint_refusals()))
    assert len(openings) >= 20, openings  # the walk found vLLM's validators
    assert [o for o in openings if not is_constraint_refusal(o)] == []


@pytest.mark.parametrize(
    "message",
    [
        "The decoder prompt cannot be empty",
        "top_k must be 0 (disable), or at least 1, got -5.",
        "This model's maximum context length is 2048 tokens.",
        "7 validation errors for ValidatorIterator",
        "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
    ],
)
def test_other_refusals_are_not_taken_for_a_constraint(message):
    assert not is_constraint_refusal(message)
    assert constraint_param(message, {"messages": MSG, "structured_outputs": {"regex": "("}}) is None


@pytest.mark.parametrize(
    "body,field",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "structural_tag", "format": {}}}, "response_format"),
        # response_format overrides structured_outputs in vLLM
        (
            {"response_format": {"type": "json_schema", "json_schema": {}}, "structured_outputs": {"regex": "a"}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "text"}, "structured_outputs": {"regex": "a"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"json": "{", "regex": None}}, "structured_outputs.json"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
        ({"tools": [TOOL], "tool_choice": "required"}, "tools[0].function.parameters"),
        ({"tools": [TOOL, OTHER_TOOL], "tool_choice": "required"}, "tools"),
        (
            {"tools": [TOOL, OTHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tools[1].function.parameters",
        ),
        # no constraint, or one vLLM refuses naming it
        ({"tools": [TOOL], "tool_choice": "auto"}, None),
        ({"tools": [TOOL]}, None),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, None),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, None),
        ({"structured_outputs": {}}, None),
        ({"response_format": "json"}, None),
        ({}, None),
        ([], None),
    ],
)
def test_the_field_is_the_one_that_holds_the_constraint(body, field):
    assert constraint_field(body) == field


def test_a_grammar_error_names_the_field():
    body = {"messages": MSG, "structured_outputs": {"grammar": "root ::= ("}}
    assert constraint_param("Invalid grammar specification.", body) == "structured_outputs.grammar"
    assert constraint_param("Grammar error: at 1:1: unknown name", body) == "structured_outputs.grammar"
