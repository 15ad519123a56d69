"""The JSON type each number or boolean field of vLLM's request models takes, and a check that a request sends it.

vLLM's request models validate in pydantic's lax mode: "max_tokens": "2", "stream": "yes" and "temperature": true
were served (as 2, a stream and 1.0). OpenAI answers those with 400 "Invalid type for 'max_tokens': expected an
integer, but got a string instead.", and a client that sends them has a bug worth hearing about. The fields come
from vLLM's own models, so a field vLLM adds is checked without a change here.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

_MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": AnthropicMessagesRequest,
    "/v1/messages/count_tokens": AnthropicCountTokensRequest,
}
_EXPECTED = {int: "an integer", float: "a number", bool: "a boolean"}


@functools.cache
def scalar_fields(path: str) -> Mapping[str, type]:
    """Field -> int, float or bool, for the fields of the route's request model that take one of those alone (or
    null)."""
    model = _MODELS.get(path)
    if model is None:
        return {}
    return {name: kind for name, field in model.model_fields.items() if (kind := _scalar(field.annotation))}


def wrong_type(path: str, body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(message, field) for the first field of `body` whose value is not of its JSON type, or None."""
    fields = scalar_fields(path)
    for name, value in body.items():
        kind = fields.get(name)
        if kind is None or value is None or _fits(kind, value):
            continue
        return f"Invalid type for '{name}': expected {_EXPECTED[kind]}, but got {_json_type(value)} instead.", name
    return None


def _scalar(annotation: Any) -> type | None:
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = [_bare(branch) for branch in (typing.get_args(annotation) if union else (annotation,))]
    kinds = [kind for kind in kinds if kind is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in _EXPECTED else None


def _bare(annotation: Any) -> Any:
    """`int` of `Annotated[int, Field(ge=1)]` (vLLM's truncate_prompt_tokens, stream_interval)."""
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation


def _fits(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    # JSON has one number type: 2.0 for an integer is left to pydantic, which takes it and refuses 2.5.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
