"""The deployment's bound on what one request may generate (max_tokens_limit), applied to the request's body before
vLLM reads it: a larger limit, or none where the API's default is the whole context, is served up to the bound, as
llama-server's `--n-predict` caps its requests. Refusing instead would break clients with fixed budgets (Claude Code
asks for 32,000 tokens); the response's header says what was served, and `usage` the real count."""

from __future__ import annotations

from typing import Any

from service.server.openai_compat.request_checks import CHAT, CHAT_BATCH, COMPLETIONS, MESSAGES, RESPONSES, served_as

HEADER = "X-Service-Max-Tokens"
# Each route's fields for the output limit, the one vLLM reads first first; the field set where none is given.
FIELDS = {
    CHAT: ("max_completion_tokens", "max_tokens"),
    CHAT_BATCH: ("max_completion_tokens", "max_tokens"),
    COMPLETIONS: ("max_tokens",),
    RESPONSES: ("max_output_tokens",),
    MESSAGES: ("max_tokens",),
}
COMPLETIONS_DEFAULT = 16  # OpenAI's (and vLLM's) max_tokens of a completion that names none


def limit_output(path: str, body: Any, limit: int | None) -> str | None:
    """Bounds `body`'s output limit at `limit`, in place; the header's value when it changed the request, else None.
    A value of the wrong type is left alone: the request checks and vLLM's schema refuse it by name."""
    if limit is None or not isinstance(body, dict):
        return None
    route = served_as(path, body)
    fields = FIELDS.get(route)
    if fields is None:
        return None
    given = {field: body[field] for field in fields if body.get(field) is not None}
    if any(not isinstance(value, int) or isinstance(value, bool) for value in given.values()):
        return None
    if not given:
        # Anthropic's API requires max_tokens: vLLM refuses its absence by name; a completion's default is small.
        if route == MESSAGES or (route == COMPLETIONS and COMPLETIONS_DEFAULT <= limit):
            return None
        body[fields[0]] = limit
        return f"{limit}; the request set none (max_tokens_limit)"
    over = {field: value for field, value in given.items() if value > limit}
    if not over:
        return None
    body.update(dict.fromkeys(over, limit))
    asked = ", ".join(f"{field}={value}" for field, value in over.items())
    return f"{limit}; the request asked {asked} (max_tokens_limit)"
