"""Anthropic's Messages API (/v1/messages, its count_tokens): roles and content blocks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.server.openai_compat.request_checks.common import RequestProblem

# What a block of Anthropic's content must carry, as Anthropic's API refuses it without (vLLM served a tool_result
# without its tool_use_id, 200).
ANTHROPIC_BLOCK_FIELDS = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",)}


def check_anthropic_messages(messages: Any) -> RequestProblem | None:
    """Anthropic's Messages API in its own terms: roles user, assistant and system (a system message mid-conversation,
    which Claude Code sends and vLLM's protocol takes; any other role vLLM served, 200), content a non-empty string or
    list of blocks (an assistant's empty list was served), each block with the fields its type needs."""
    if not isinstance(messages, list):
        return None  # vLLM's schema names it
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return None
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant", "system"):
            return RequestProblem(
                f"messages[{i}].role: {role!r} is not a role of the Messages API (user, assistant, system)",
                f"messages[{i}].role",
            )
        if content in ("", []):
            return RequestProblem(
                f"messages[{i}].content is empty: send text or at least one block", f"messages[{i}].content"
            )
        for j, block in enumerate(content if isinstance(content, list) else ()):
            kind = block.get("type") if isinstance(block, Mapping) else None
            missing = [f for f in ANTHROPIC_BLOCK_FIELDS.get(kind, ()) if block.get(f) is None]
            if missing:
                where = f"messages[{i}].content[{j}].{missing[0]}"
                return RequestProblem(
                    f"{where}: Field required (a {kind} block carries {', '.join(ANTHROPIC_BLOCK_FIELDS[kind])})", where
                )
    return None
