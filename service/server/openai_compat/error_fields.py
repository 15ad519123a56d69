"""Which request field an error is about, in OpenAI's spelling (`messages[0].content[1].type`): from a schema
error's locations, from the words of vLLM's message, or from the request's body when vLLM's error cannot know it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, get_args

from fastapi import Request
from pydantic import TypeAdapter, ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.serve.exception_handling.handlers.validation import clean_loc_for_param

from service.server.openai_compat.constraint_errors import constraint_param

# vLLM's sampling checks raise "top_k must be 0 (disable), or at least 1, got -5." without a param: the field
# leads the message. Others name it inside ("... (parameter=logprobs, value=21)") and still leave param empty.
_LEADING_FIELD = re.compile(r"([a-z_]+) (?:must|cannot)\b")
_PARAMETER_NOTE = re.compile(r"\(parameter=([a-z_]+)[,)]")
_REQUEST_FIELDS = frozenset(ChatCompletionRequest.model_fields) | frozenset(CompletionRequest.model_fields)


def field_path(errors: Sequence[Any], within: str = "") -> str | None:
    """OpenAI's spelling of the field a request's schema errors are about: `messages[0].name`, not
    `body.messages.0.ChatCompletionDeveloperMessageParam.role`. A field of several shapes (a message: one per role)
    fails once per shape. The request meant a shape whose tag (`role`, a part's `type`) it matched, and of those
    the one that failed on the fewest fields. `within`: the field the errors' locations start in."""
    chosen = _chosen(errors, within)
    # A location inside a list a validator checked on its own starts at the item: the field is unknown.
    return chosen[0] if chosen is not None and chosen[0][:1].isalpha() else None


def schema_message(errors: Sequence[Any]) -> str | None:
    """One line for a request that does not fit the schema, about the error `field_path` names: "validation error:
    response_format.type: Input should be 'text', 'json_object' or 'json_schema' (got "xml")". vLLM's message
    lists every error as a Python dict, one per shape of a union: "6 validation errors: {'type': ...}" for one
    wrong value."""
    if (whole := _whole_body(errors)) is not None:
        return whole
    chosen = _vllm_named(errors) or _chosen(errors, "")
    if chosen is None or not chosen[0][:1].isalpha():
        return None
    path, error = chosen
    # A union (`stop`: a string or a list) fails once per branch at the same path; a branch of another type
    # ("Input should be a valid string" for a list) says less than the one of the value's own type ("List should
    # have at most 4 items").
    same_place = [e for e in errors if isinstance(e, dict) and e.get("loc") and _path(e["loc"])[1] == path]
    error = next((e for e in same_place if not str(e.get("type", "")).endswith("_type")), error)
    value = error.get("input")
    shown = json.dumps(value, ensure_ascii=False) if isinstance(value, str | int | float | bool) else None  # as sent
    got = f" (got {shown if len(shown) <= _SHOWN_CHARS else shown[:_SHOWN_CHARS] + '...'})" if shown else ""
    return f"validation error: {path}: {error.get('msg', 'invalid value')}{got}"


_SHOWN_CHARS = 40  # of the value echoed back: enough to recognise it, never a whole prompt


def _whole_body(errors: Sequence[Any]) -> str | None:
    """The message for an error about the body as a whole (not JSON, not an object, null or empty), or for one a
    check of vLLM's raised as a bare string (a Content-Type other than JSON)."""
    for error in errors:
        if isinstance(error, str):
            return error
        loc = tuple(error.get("loc") or ()) if isinstance(error, dict) else ()
        if loc[:1] != ("body",) or any(isinstance(part, str) for part in loc[1:]):
            continue
        if error.get("type") == "json_invalid":  # FastAPI puts the parser's position after "body"
            at = f" at character {loc[1]}" if len(loc) > 1 else ""
            return f"the request body is not valid JSON: {(error.get('ctx') or {}).get('error', 'cannot parse')}{at}"
        if error.get("type") == "missing":
            return "the request body is empty or null: send a JSON object"
        return f"the request body must be a JSON object, not {_json_kind(error.get('input'))}"
    return None


def _json_kind(value: Any) -> str:
    kinds = ((bool, "a boolean"), (int | float, "a number"), (str, "a string"), (list, "an array"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "that")


def _vllm_named(errors: Sequence[Any]) -> tuple[str, dict[str, Any]] | None:
    """The error a validator of vLLM raised naming its field (VLLMValidationError.parameter): vLLM's handler takes
    that field as the param, so the message is about it too."""
    for error in errors:
        parameter = getattr(
            (error.get("ctx") or {}).get("error") if isinstance(error, dict) else None, "parameter", None
        )
        if isinstance(parameter, str) and parameter:
            return parameter, error
    return None


def _chosen(errors: Sequence[Any], within: str) -> tuple[str, dict[str, Any]] | None:
    found = [(_path(e["loc"]), e) for e in errors if isinstance(e, dict) and e.get("loc")]
    if not found:
        return None
    untagged = {shape for (shape, _), e in found if e.get("type") == "literal_error"}
    meant = [item for item in found if item[0][0] not in untagged] or found
    failures = Counter(shape for (shape, _), _ in meant)
    (_, path), error = min(meant, key=lambda item: failures[item[0][0]])  # min keeps the first of equals
    return within + path, error


def named_field(message: str) -> str | None:
    """The request field an engine error's message names, as "(parameter=logprobs, ...)" or by starting with it
    ("stop cannot contain an empty string."), or None."""
    found = _PARAMETER_NOTE.search(message) or _LEADING_FIELD.match(message)
    return found.group(1) if found is not None and found.group(1) in _REQUEST_FIELDS else None


def _path(loc: Sequence[Any]) -> tuple[tuple[str, ...], str]:
    """(the shape branches taken, the field path) of a pydantic error location, without FastAPI's `body` and
    without pydantic's own wrapper names (vLLM's clean_loc_for_param)."""
    shape: tuple[str, ...] = ()
    path = ""
    for part in clean_loc_for_param(tuple(loc)).split(".")[1 if loc and loc[0] == "body" else 0 :]:
        if part.isdigit():
            path += f"[{part}]"
        elif part[:1].isupper():  # a class name: the branch of a union, not a field
            shape += (path, part)
        elif part:
            path += f".{part}" if path else part
    return shape, path


# vLLM's request schema takes a message's content parts and an assistant's tool calls as lazy iterables (the OpenAI
# types' `Iterable[...]`): FastAPI's validation lets them through, and the chat parser's iteration later refuses a
# bad item with "N validation errors for ValidatorIterator", the errors' locations starting at the item.
_ITEM_REFUSAL = "for ValidatorIterator"
_MESSAGE = TypeAdapter(get_args(ChatCompletionRequest.model_fields["messages"].annotation)[0])


def message_field(message: str, body: Any) -> str | None:
    """The field of the message item that vLLM refused item by item: the body's messages are validated again with
    vLLM's own message type and their lazy iterables drained (only on that refusal: a failing request pays it)."""
    if _ITEM_REFUSAL not in message or not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None
    return next(_refused_items(body["messages"], "messages"), None)


def _refused_items(messages: list[Any], within: str) -> Iterator[str]:
    for i, message in enumerate(messages):
        if isinstance(message, list):  # /v1/chat/completions/batch: a list of conversations
            yield from _refused_items(message, f"{within}[{i}]")
            continue
        try:
            validated = _MESSAGE.validate_python(message)
        except ValidationError:  # not the refusal asked about: FastAPI answers these itself
            continue
        for key, value in validated.items() if isinstance(validated, dict) else ():
            if isinstance(value, Iterator):
                try:
                    list(value)
                except ValidationError as exc:
                    found = field_path(exc.errors(include_url=False), f"{within}[{i}].{key}")
                    if found is not None:
                        yield found


def unnamed_field(message: str, body: Any) -> str | None:
    """The field a 400 that vLLM sent without `param` is about, from its message and the request's body."""
    return named_field(message) or constraint_param(message, body) or message_field(message, body)


def parsed_body(request: Request | None) -> Any:
    """The request's JSON body as the admission check parsed it (kept in the request's scope, so every Request
    object over it sees it), or None."""
    return None if request is None else getattr(request.state, "json_body", None)
