"""Chat requests (/v1/chat/completions, its batch, the messages /tokenize is sent): roles, content, tool calls,
tools, formats."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from service.facts.model import ModelFacts
from service.server.openai_compat.request_checks.common import RequestProblem, schema_problem

# Roles of OpenAI's chat API (function: deprecated, still accepted by OpenAI).
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


# Roles whose messages OpenAI refuses without `content` (an assistant's may carry tool calls instead).
CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool", "function"})


# Content parts that carry something other than text (vLLM's names and OpenAI's).
MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "image_embeds", "image_pil", "audio_url", "input_audio", "video_url", "file"}
)


def check_messages(messages: Any, model: ModelFacts | None) -> RequestProblem | None:
    if not isinstance(messages, list):
        return None
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if not isinstance(role, (str, type(None))):  # a wrong shape (an object is not even hashable): vLLM names it
            continue
        if isinstance(role, str) and role not in ROLES:
            return RequestProblem(
                f"messages[{i}].role {role!r} is not a role: one of {', '.join(sorted(ROLES))}", f"messages[{i}].role"
            )
        if role in CONTENT_REQUIRED and message.get("content") is None:
            return RequestProblem(f"messages[{i}] ({role}) has no content", f"messages[{i}].content")
        if role == "assistant" and message.get("content") is None and not calls_tools(message):
            return RequestProblem(
                f"messages[{i}] (assistant) has neither content nor tool_calls: an assistant message needs one",
                f"messages[{i}].content",
            )
        if role in CONTENT_REQUIRED and message["content"] == []:
            return RequestProblem(
                f"messages[{i}] ({role}) has an empty list of content parts: send a string or at least one part",
                f"messages[{i}].content",
            )
        if role == "tool" and not message.get("tool_call_id"):
            return RequestProblem(
                f"messages[{i}] has role 'tool' but no tool_call_id: a tool message answers the assistant's tool call "
                "with that id",
                f"messages[{i}].tool_call_id",
            )
        for problem in (
            check_content_shape(i, message.get("content")),
            check_content_parts(i, message.get("content"), model),
            check_tool_calls(i, message.get("tool_calls")) if role == "assistant" else None,
        ):
            if problem is not None:
                return problem
    return None


def calls_tools(message: Mapping[str, Any]) -> bool:
    return bool(message.get("tool_calls")) or message.get("function_call") is not None


def check_content_shape(i: int, content: Any) -> RequestProblem | None:
    """A message's content is a string or a list of parts; a text part carries its text as a string."""
    where = f"messages[{i}].content"
    if isinstance(content, Mapping):
        return RequestProblem(f"{where} must be a string or a list of content parts, not an object", where)
    if not isinstance(content, list):
        return None
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            if isinstance(part, str):
                continue  # vLLM takes bare strings in some roles' lists
            return RequestProblem(
                f'{where}[{j}] must be a content part object, such as {{"type": "text", "text": "..."}}',
                f"{where}[{j}]",
            )
        kind = part.get("type")
        if kind is None and "text" in part:
            return RequestProblem(
                f'{where}[{j}] has no type: a text part is {{"type": "text", "text": "..."}}', f"{where}[{j}].type"
            )
        if kind is not None and not isinstance(kind, str):
            return RequestProblem(f"{where}[{j}].type must be a string, such as 'text'", f"{where}[{j}].type")
        if kind is not None and kind not in part_types():
            return RequestProblem(
                f"{where}[{j}].type {kind!r} is not a content part type: one of {', '.join(sorted(part_types()))}",
                f"{where}[{j}].type",
            )
        if kind == "text" and not isinstance(part.get("text"), str):
            return RequestProblem(f"{where}[{j}] is a text part without a string 'text'", f"{where}[{j}].text")
    return None


@functools.cache
def part_types() -> frozenset[str]:
    """The content part types vLLM's chat parser takes, as its own refusal lists them (which its request schema,
    checking parts one by one, never reaches: "8 validation errors for ValidatorIterator", no param)."""
    from vllm.renderers.chat_utils import MM_PARSER_MAP, PART_TYPES_TO_SKIP_NONE_CONTENT

    return frozenset(MM_PARSER_MAP) | frozenset(PART_TYPES_TO_SKIP_NONE_CONTENT)


def check_tool_calls(i: int, tool_calls: Any) -> RequestProblem | None:
    """An assistant's tool calls as OpenAI's API spells them: [{id, type: "function", function: {name, arguments}}]."""
    where = f"messages[{i}].tool_calls"
    if tool_calls is None:
        return None
    if not isinstance(tool_calls, list):
        return RequestProblem(f"{where} must be a list of tool calls", where)
    for k, call in enumerate(tool_calls):
        at = f"{where}[{k}]"
        if not isinstance(call, Mapping):
            return RequestProblem(f"{at} must be a tool call object", at)
        if not isinstance(call.get("id"), str):
            return RequestProblem(f"{at}.id must be a string: the id its tool message answers", f"{at}.id")
        if call.get("type") != "function":
            return RequestProblem(f"{at}.type must be 'function', got {call.get('type')!r}", f"{at}.type")
        function = call.get("function")
        if not isinstance(function, Mapping):
            return RequestProblem(f"{at}.function must be an object with name and arguments", f"{at}.function")
        if not isinstance(function.get("name"), str):
            return RequestProblem(f"{at}.function.name must be a string", f"{at}.function.name")
        if not isinstance(function.get("arguments"), str):
            return RequestProblem(
                f"{at}.function.arguments must be a string (the arguments as JSON text)", f"{at}.function.arguments"
            )
    return None


def check_no_messages(messages: Any) -> RequestProblem | None:
    """vLLM refuses an empty conversation without naming the field."""
    if messages == []:
        return RequestProblem("messages is empty: a chat request needs at least one message", "messages")
    return None


def check_conversations(conversations: Any, model: ModelFacts | None) -> RequestProblem | None:
    """A batch's conversations, each checked as a chat request's messages; the param says which one."""
    if not isinstance(conversations, list):
        return None
    for b, messages in enumerate(conversations):
        problem = check_messages(messages, model)
        if problem is not None:
            return RequestProblem(
                problem.message.replace("messages[", f"messages[{b}][", 1),
                problem.param.replace("messages[", f"messages[{b}][", 1),
            )
    return None


def check_content_parts(
    i: int, content: Any, model: ModelFacts | None, items: str = "messages"
) -> RequestProblem | None:
    if not isinstance(content, list) or model is None or model.is_multimodal:
        return None
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if isinstance(kind, str) and kind in MEDIA_PARTS:
            return RequestProblem(
                f"{items}[{i}].content[{j}] is a {kind!r} part, but the model takes text only",
                f"{items}[{i}].content[{j}]",
            )
    return None


def check_output_modalities(body: Mapping[str, Any]) -> RequestProblem | None:
    """The engine answers in text: a request for audio would get text alone, which a client reading
    `message.audio` does not expect."""
    modalities = body.get("modalities")
    if isinstance(modalities, list):
        other = [m for m in modalities if m != "text"]
        if other:
            return RequestProblem(f"modalities {other} are not served: the model answers in text only", "modalities")
    if body.get("audio") is not None:
        return RequestProblem("audio output is not served: the model answers in text only", "audio")
    return None


def check_response_format(response_format: Any) -> RequestProblem | None:
    if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
        return None
    json_schema = response_format.get("json_schema")
    if not isinstance(json_schema, Mapping):
        return None
    return schema_problem(json_schema.get("schema"), "response_format.json_schema.schema")


def check_web_search(body: Mapping[str, Any]) -> RequestProblem | None:
    """OpenAI's search models' option, which vLLM ignores: the answer would come without the search asked for."""
    if body.get("web_search_options") is None:
        return None
    return RequestProblem("web_search_options: this server does not search the web", "web_search_options")


def check_tools(tools: Any) -> RequestProblem | None:
    if not isinstance(tools, list):
        return None
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping):
            problem = schema_problem(function.get("parameters"), f"tools[{i}].function.parameters")
            if problem is not None:
                return problem
    return None
