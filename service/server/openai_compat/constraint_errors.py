"""Which request field vLLM's refusal of an output constraint is about.

vLLM compiles a request's output constraint (a JSON schema, regex, grammar, choice list or structural tag) when it
builds the request's sampling parameters, and refuses one that does not compile ("Grammar error: ...", "Invalid
grammar specification.", "Failed to transform regex into a grammar: ...") with a 400 that names no field: the
sampling parameters no longer know where the constraint came from. The body does: a request holds one constraint,
from `response_format` (which overrides `structured_outputs`), `structured_outputs`, or the tools a `tool_choice`
forces a call to. Pure functions of (message, parsed body).
"""

from __future__ import annotations

import re
from typing import Any

# The openings of vLLM 0.32's constraint refusals: SamplingParams._validate_structured_outputs and the backends'
# validators in vllm/v1/structured_output/ (tests/unit/server/test_constraint_errors.py reads them from vLLM's source, so
# a new one fails the test rather than going unnamed).
_CONSTRAINT_REFUSAL = re.compile(
    r"(Grammar error|Invalid (JSON grammar|grammar|structural tag) specification|Failed to (transform|compile) "
    r"|structured_outputs\.|Structured outputs|Choice '|The provided JSON schema|Error parsing regex|Regex "
    r"|Error serializing structured outputs|Outlines structured outputs|LM Format Enforcer|Trigger |No structural tags"
    r"|No compatible structured output|Request-level structured output|(Non-tekken )?Mistral tokenizer"
    r"|The 'guidance' structured output)"
)
# structured_outputs' constraint kinds (vLLM's StructuredOutputsParams); a request may set one.
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def is_constraint_refusal(message: str) -> bool:
    return _CONSTRAINT_REFUSAL.match(message) is not None


def constraint_field(body: Any) -> str | None:
    """OpenAI's spelling of the field that holds the request's output constraint, or None when it holds none (or
    several, which vLLM refuses naming them)."""
    if not isinstance(body, dict):
        return None
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return "response_format.json_schema.schema" if response_format["type"] == "json_schema" else "response_format"
    structured = body.get("structured_outputs")
    if isinstance(structured, dict):
        kinds = [kind for kind in _KINDS if structured.get(kind) is not None]
        if len(kinds) == 1:
            return f"structured_outputs.{kinds[0]}"
    return _forced_tool(body.get("tools"), body.get("tool_choice"))


def _forced_tool(tools: Any, choice: Any) -> str | None:
    """The tool whose parameters become the constraint when `tool_choice` forces a call: the named one, or all of
    them for "required"."""
    if not isinstance(tools, list) or not tools:
        return None
    if choice == "required":
        return "tools[0].function.parameters" if len(tools) == 1 else "tools"
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and tool["function"].get("name") == name:
            return f"tools[{i}].function.parameters"
    return None


def constraint_param(message: str, body: Any) -> str | None:
    """The field a 400 without `param` is about, when its message is a constraint refusal."""
    return constraint_field(body) if is_constraint_refusal(message) else None
