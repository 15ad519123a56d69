"""vLLM's chat and completion response models without the validator meant for requests.

Every vLLM protocol model derives from `OpenAIBaseModel`, whose wrap validator `__log_extra_fields__` calls back
into Python on each construction to log request fields vLLM ignores. The server builds three of these models per
streamed token (chunk, choice, delta), from its own keyword arguments, so the check can find nothing there; it is
about a third of the cost of building a chunk (bench/tools/chunk_cost.py). Request models keep it.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator

from pydantic import BaseModel

VALIDATOR = "__log_extra_fields__"

# The models the chat and completion endpoints build as answers; what they nest is found from their fields.
_ROOTS = (
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionStreamResponse"),
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionResponse"),
    ("vllm.entrypoints.openai.completion.protocol", "CompletionStreamResponse"),
    ("vllm.entrypoints.openai.completion.protocol", "CompletionResponse"),
)


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def response_models() -> list[type[BaseModel]]:
    """The root response models and every model they nest, each after the models it nests."""
    import importlib

    ordered: list[type[BaseModel]] = []
    seen: set[type[BaseModel]] = set()

    def visit(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for field in model.model_fields.values():
            for nested in _models_in(field.annotation):
                visit(nested)
        ordered.append(model)

    for module, name in _ROOTS:
        visit(getattr(importlib.import_module(module), name))
    return ordered


def drop_request_validator() -> list[str]:
    """Rebuilds the response models without the validator, nested models first so that their containers pick up
    the new schemas; returns the names of the models that had it."""
    dropped = []
    for model in response_models():
        if model.__pydantic_decorators__.model_validators.pop(VALIDATOR, None) is not None:
            model.model_rebuild(force=True)
            dropped.append(model.__name__)
    return dropped
