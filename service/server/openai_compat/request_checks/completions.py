"""Completion requests and token ids (/v1/completions, /detokenize): prompts, and ids inside the vocabulary."""

from __future__ import annotations

from typing import Any

from service.facts.model import ModelFacts
from service.server.openai_compat.request_checks.common import RequestProblem


def check_empty_prompt(prompt: Any) -> RequestProblem | None:
    """An empty list of prompts, or an empty prompt in a list (text or token ids): vLLM refuses them without naming
    the field ("You must pass at least one prompt", "The decoder prompt cannot be empty"). A lone empty string
    it refuses naming it."""
    if prompt == []:
        return RequestProblem("prompt is an empty list: send at least one prompt", "prompt")
    if isinstance(prompt, list):
        for i, item in enumerate(prompt):
            if item in ("", []):
                return RequestProblem(f"prompt[{i}] is empty: every prompt needs at least one token", f"prompt[{i}]")
    return None


def check_token_ids(tokens: Any, model: ModelFacts | None, name: str = "tokens") -> RequestProblem | None:
    """Ids below 0 or beyond the model's vocabulary (its LM head's rows: no id the model produces is past them)."""
    if not isinstance(tokens, list):
        return None
    vocab = model.vocab_size if model is not None else None
    for i, token in enumerate(tokens):
        if isinstance(token, bool):  # vLLM's schema reads true as token 1
            return RequestProblem(f"{name}[{i}] is {str(token).lower()}, not a token id (an integer)", f"{name}[{i}]")
        if not isinstance(token, int):
            return None  # a type vLLM's schema names
        if token < 0 or (vocab is not None and token >= vocab):
            bound = f"0 .. {vocab - 1}" if vocab is not None else "not negative"
            return RequestProblem(f"{name}[{i}] = {token} is out of vocabulary ({bound})", f"{name}[{i}]")
    return None


def check_prompt_ids(prompt: Any, model: ModelFacts | None) -> RequestProblem | None:
    """A completion's prompt as token ids: one list of ids, or a list of such lists."""
    if not isinstance(prompt, list) or not prompt:
        return None
    if not all(isinstance(p, list) for p in prompt):
        return check_token_ids(prompt, model, "prompt")
    return next(
        (p for i, ids in enumerate(prompt) if (p := check_token_ids(ids, model, f"prompt[{i}]")) is not None), None
    )
