"""Schemathesis hooks (SCHEMATHESIS_HOOKS=tests.reliability.st_hooks): the OpenAI error-shape check, and generated
lengths kept short."""

from __future__ import annotations

import json

import schemathesis

from service.server.openai_compat.anthropic_errors import anthropic_type, is_anthropic_path

# Probes answer 503 with their own status document, not an API error.
PROBES = ("/health", "/ready")
# How many tokens a generated request asks for. A length the server accepts (up to its context, the shared server's
# 1024) is decoded in full: such cases took most of the test's 221 s on a Zen 1. Those are cut to LENGTH_CAP; values
# past the context, negative or of the wrong type still go as generated (the server refuses them at once).
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of")
LENGTH_CAP, CONTEXT = 4, 1024


@schemathesis.hook
def map_body(ctx, body):
    if isinstance(body, dict):
        for field in LENGTH_FIELDS:
            value = body.get(field)
            if type(value) is int and LENGTH_CAP < value <= CONTEXT:
                body[field] = LENGTH_CAP
    return body


@schemathesis.check
def openai_error_shape(ctx, response, case) -> None:
    """Every error answer is {"error": {"message", "type", "param", "code"}} with code == HTTP status; on
    Anthropic's routes, Anthropic's {"type": "error", "error": {"type", "message"}} with its type for the status."""
    if response.status_code < 400 or case.operation.path in PROBES:
        return
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise AssertionError(f"{response.status_code} error body is not JSON: {response.content[:200]!r}") from exc
    if is_anthropic_path(case.operation.path):
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        expected = {"type": "error", "error": {"type": anthropic_type(response.status_code), "message": message}}
        if body != expected or not isinstance(message, str) or not message:
            raise AssertionError(f"{response.status_code} error body is not in Anthropic's shape: {body!r:.300}")
        return
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not {"message", "type", "param", "code"} <= error.keys():
        raise AssertionError(f"{response.status_code} error body is not in the OpenAI shape: {body!r:.300}")
    if not isinstance(error["message"], str) or not error["message"]:
        raise AssertionError(f"error message is empty: {body!r:.300}")
    if error["code"] != response.status_code:
        raise AssertionError(f"error.code {error['code']} != HTTP status {response.status_code}")
