"""Tools a client asks the server itself to run (OpenAI's and Anthropic's hosted tools: web search, file search, code
interpreter, computer use, image generation, MCP servers), which this server has no tool server for.

Agents send them by default (Codex CLI sends `web_search` with every request), so refusing them refused the agent.
As llama.cpp's server does, they are left out of the prompt and the model answers with the tools it can call; the
response's header and the log say which were left out. `hosted_tools=refuse` keeps the 400 (request_checks/) for
deployments that would rather a client learn it at once. A request that forces one of them (`tool_choice` naming it)
is refused either way: it asks for what cannot be done."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from service.server.openai_compat.request_checks import (
    CHAT,
    CHAT_BATCH,
    MESSAGES,
    RESPONSES,
    RESPONSES_TOOLS,
    served_as,
)

log = logging.getLogger("service.http")
HEADER = "X-Service-Skipped-Tools"
# Anthropic's client tools are plain (no type, or "custom") with an input_schema; its server tools carry a versioned
# type (web_search_20250305, code_execution_20250522, ...) and no schema.
ANTHROPIC_CLIENT_TOOL = frozenset({None, "custom"})


def skip_hosted_tools(path: str, body: Any) -> list[str]:
    """Removes, in place, the hosted tools of a request to `path`; their names (empty: none, or one is forced)."""
    if not isinstance(body, dict):
        return []
    route = served_as(path, body)
    if route == RESPONSES:
        return _skip_tools(body, lambda tool: tool.get("type") not in RESPONSES_TOOLS, _forced_type)
    if route == MESSAGES:
        skipped = _skip_tools(body, _anthropic_server_tool, _forced_name)
        if body.get("mcp_servers"):
            skipped.append("mcp_servers")
            del body["mcp_servers"]
        return skipped
    if route in (CHAT, CHAT_BATCH) and body.get("web_search_options") is not None:
        del body["web_search_options"]  # OpenAI's search models' option: vLLM would ignore it silently
        return ["web_search_options"]
    return []


def _anthropic_server_tool(tool: Mapping[str, Any]) -> bool:
    return tool.get("type") not in ANTHROPIC_CLIENT_TOOL and "input_schema" not in tool


def _skip_tools(body: dict[str, Any], hosted: Any, forced: Any) -> list[str]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    skipped = [tool for tool in tools if isinstance(tool, Mapping) and hosted(tool)]
    if not skipped or any(forced(body.get("tool_choice"), tool) for tool in skipped):
        return []  # none, or one forced: the request checks refuse it by name
    body["tools"] = [tool for tool in tools if tool not in skipped]
    return [_name(tool) for tool in skipped]


def _forced_type(choice: Any, tool: Mapping[str, Any]) -> bool:
    return isinstance(choice, Mapping) and choice.get("type") == tool.get("type")


def _forced_name(choice: Any, tool: Mapping[str, Any]) -> bool:
    return isinstance(choice, Mapping) and choice.get("type") == "tool" and choice.get("name") == tool.get("name")


def _name(tool: Mapping[str, Any]) -> str:
    """How a client names the tool: an MCP server by its label, Anthropic's server tools by name, OpenAI's by type."""
    kind = tool.get("type")
    if kind == "mcp":
        return f"mcp:{tool.get('server_label')}"
    return str(tool.get("name") or kind)


def header_value(skipped: list[str]) -> str:
    return ", ".join(skipped) + " (this server runs no hosted tools; left out of the prompt)"


def said(path: str, skipped: list[str]) -> None:
    log.warning("%s: left out the hosted tools %s, which this server does not run", path, ", ".join(skipped))
