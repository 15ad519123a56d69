"""/v1/responses: its output limit, its input list, media parts, built-in tools and JSON schemas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.facts.model import ModelFacts
from service.server.openai_compat.request_checks.chat import check_content_parts
from service.server.openai_compat.request_checks.common import RequestProblem, is_number, schema_problem

# The /v1/responses tool types vLLM serves without a tool server (which the service does not run): the rest are
# OpenAI's built-in tools (web_search, file_search, code_interpreter, mcp, ...), which vLLM drops from the request.
RESPONSES_TOOLS = frozenset({"function", "custom", "namespace"})


def check_responses(body: Mapping[str, Any], model: ModelFacts | None) -> RequestProblem | None:
    """/v1/responses: vLLM named the limit `max_tokens` (its sampling field) and left `param` empty for an empty
    input list, for a JSON schema that is not one ("Grammar error: Invalid type: nonsense") and for an image sent to
    a text-only model ("X is not a multimodal model"); it serves a built-in tool's request without the tool."""
    limit = body.get("max_output_tokens")
    if is_number(limit) and limit < 1:
        return RequestProblem(f"max_output_tokens must be at least 1, got {limit}", "max_output_tokens")
    items = body.get("input")
    if items == []:
        return RequestProblem("input is an empty list: send at least one item", "input")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, Mapping) and (problem := check_content_parts(i, item.get("content"), model, "input")):
            return problem
    text = body.get("text")
    response_format = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        if (problem := schema_problem(response_format.get("schema"), "text.format.schema")) is not None:
            return problem
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if isinstance(kind, str) and kind not in RESPONSES_TOOLS:
            return RequestProblem(
                f"tools[{i}] is a built-in {kind!r} tool, which this server does not run (it has no tool server): "
                f"send function tools",
                f"tools[{i}].type",
            )
        if kind == "function":
            if (problem := schema_problem(tool.get("parameters"), f"tools[{i}].parameters")) is not None:
                return problem
    return None
