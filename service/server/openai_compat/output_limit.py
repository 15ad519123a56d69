"""What one request may generate, applied to the request's body before vLLM reads it: a limit larger than the context
(Claude Code asks for 32,000 tokens), or larger than the deployment's bound (max_tokens_limit), is served up to what
fits, as llama.cpp's server and Ollama do, instead of vLLM's 400. vLLM itself then stops a sequence where the context
ends (prompt + output), and `usage` gives the real count; the response's header says what was changed. A prompt
that alone exceeds the context is still vLLM's 400, naming both numbers.

Where a request sets no limit, the API's default holds (a completion's 16; otherwise up to the context), bounded by
max_tokens_limit where the deployment sets one."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class OutputBound:
    context: int | None = None  # max_model_len: no sequence outgrows it
    deployment: int | None = None  # max_tokens_limit

    def bound(self) -> tuple[int, str] | None:
        """The tighter bound and what it is, None where there is none."""
        bounds = [(self.deployment, "max_tokens_limit"), (self.context, "the context length")]
        given = [(value, why) for value, why in bounds if value is not None]
        return min(given, key=lambda pair: pair[0]) if given else None


def limit_output(path: str, body: Any, limits: OutputBound) -> str | None:
    """Bounds `body`'s output limit, in place; the header's value when it changed the request, else None. A value of
    the wrong type is left alone: the request checks and vLLM's schema refuse it by name."""
    bound = limits.bound()
    if bound is None or not isinstance(body, dict):
        return None
    limit, why = bound
    route = served_as(path, body)
    fields = FIELDS.get(route)
    if fields is None:
        return None
    given = {field: body[field] for field in fields if body.get(field) is not None}
    if any(not isinstance(value, int) or isinstance(value, bool) for value in given.values()):
        return None
    if not given:
        # Up to the context is every API's default but a completion's (small); Anthropic's requires max_tokens, which
        # vLLM names when it is missing.
        if limits.deployment is None or route == MESSAGES or (route == COMPLETIONS and COMPLETIONS_DEFAULT <= limit):
            return None
        body[fields[0]] = limit
        return f"{limit}; the request set none ({why})"
    over = {field: value for field, value in given.items() if value > limit}
    if not over:
        return None
    body.update(dict.fromkeys(over, limit))
    asked = ", ".join(f"{field}={value}" for field, value in over.items())
    return f"{limit}; the request asked {asked}, over {why} ({limit}): served up to what fits"
