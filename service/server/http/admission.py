"""Which requests reach the engine: a FastAPI dependency of every engine route.

503 + Retry-After while the engine starts or the service drains; 400 for a request OpenAI would refuse that
vLLM lets through (request_checks/) or one that could never be admitted; the deployment's output bound
(max_tokens_limit, output_limit.py) written into the body; the requests in flight counted until their response
(streamed ones too) has been sent, so a drain knows when they are done."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import Request

from service.facts.model import ModelFacts
from service.server.http.routes import POOLING_ROUTES
from service.server.openai_compat import hosted_tools, model_aliases
from service.server.openai_compat.errors import RETRY_AFTER_SECONDS, ServiceError
from service.server.openai_compat.model_aliases import ModelAliases
from service.server.openai_compat.output_limit import HEADER as OUTPUT_LIMIT_HEADER
from service.server.openai_compat.output_limit import OutputBound, limit_output
from service.server.openai_compat.request_checks import CHAT_BATCH, CHECKED_PATHS, COMPLETIONS, check_request, served_as
from service.server.supervision.lifecycle import Lifecycle


def sequences_beyond_admission(body: Any, max_queued: int, path: str = "") -> ServiceError | None:
    """vLLM answers 503 (retry later) to a request that needs more sequences than --max-num-queued-reqs,
    although it could never be admitted: retrying is pointless, so it is the client's error. A request needs n
    sequences per prompt: a completion's `prompt` may list several, a chat batch has one per conversation."""
    if not isinstance(body, dict):
        return None
    n = body.get("n")
    n = 1 if n is None else n
    prompts, param = _prompts(body, path)
    if not isinstance(n, int) or isinstance(n, bool) or prompts is None:
        return None
    count = prompts * n
    if max_queued and count > max_queued:
        return ServiceError(
            HTTPStatus.BAD_REQUEST,
            f"this request needs {count} sequences but the server admits at most {max_queued} at a time "
            "(max_queued_requests): ask for fewer",
            "BadRequestError",
            param=param if prompts > 1 else "n",
        )
    return None


def _prompts(body: dict[str, Any], path: str) -> tuple[int | None, str]:
    """How many prompts a request holds, and the field that lists them (None: a shape vLLM's schema names)."""
    if path == CHAT_BATCH:
        conversations = body.get("messages")
        return (len(conversations), "messages") if isinstance(conversations, list) else (None, "messages")
    prompt = body.get("prompt") if served_as(path, body) == COMPLETIONS else None
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return len(prompt), "prompt"  # several texts or several token-id lists; a list of ids is one prompt
    return 1, "prompt"


# The routes whose JSON body names a model: the checked ones, and the pooling routes.
NAMED_MODEL_PATHS = CHECKED_PATHS | POOLING_ROUTES


@dataclass(frozen=True)
class Bounds:
    """What a deployment changes in the requests it admits (settings): the output bound, the hosted tools, the
    model's other names."""

    output: OutputBound = OutputBound()
    skip_hosted_tools: bool = True
    aliases: ModelAliases | None = None


async def _refusal(request: Request, max_queued: int, model: ModelFacts | None, bounds: Bounds) -> ServiceError | None:
    path = request.url.path
    if request.method != "POST" or path not in NAMED_MODEL_PATHS:
        return None
    raw = await request.body()
    if not raw:
        return None
    # FastAPI has parsed the body for the route already (a body that is not JSON never gets here);
    # request.json() returns that parse.
    body = await request.json()
    request.state.json_body = body  # for naming the field of an engine error later (engine_responses.py)
    # In place, before the checks and vLLM read the body: FastAPI validates the route's body from this same parse after
    # its dependencies (this one) have run. What was changed is said in the response's headers (engine_responses.py).
    notes = request.state.service_headers = {}
    if bounds.aliases and (renamed := bounds.aliases.rename(body, _adapters(request))):
        notes[model_aliases.HEADER] = renamed
    if path not in CHECKED_PATHS:
        return None
    if bounds.skip_hosted_tools and (skipped := hosted_tools.skip_hosted_tools(path, body)):
        hosted_tools.said(path, skipped)
        notes[hosted_tools.HEADER] = hosted_tools.header_value(skipped)
    problem = check_request(path, body, model, raw)
    if problem is not None:
        return ServiceError(HTTPStatus.BAD_REQUEST, problem.message, "BadRequestError", param=problem.param)
    if (limited := limit_output(path, body, bounds.output)) is not None:
        notes[OUTPUT_LIMIT_HEADER] = limited
    return sequences_beyond_admission(body, max_queued, path)


def _adapters(request: Request) -> Collection[str]:
    """The LoRA adapters requests may name (vLLM's serving models hold them once the engine is up)."""
    models = getattr(request.app.state, "openai_serving_models", None)
    return getattr(models, "lora_requests", None) or ()


def engine_admission(
    lifecycle: Lifecycle, max_queued: int, model: ModelFacts | None, bounds: Bounds = Bounds()
) -> Callable[[Request], AsyncIterator[None]]:
    async def admit(request: Request) -> AsyncIterator[None]:
        if not lifecycle.accepting:
            raise ServiceError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"service is {lifecycle.phase.value}: {lifecycle.reason}",
                "ServiceUnavailableError",
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
        # Counted from the moment it is admitted: a SIGTERM that arrives while the body is being checked must
        # find it in flight, or the drain would end at once and leave it to uvicorn's connection wait.
        lifecycle.request_started()
        try:
            refusal = await _refusal(request, max_queued, model, bounds)
            if refusal is not None:
                raise refusal
            yield
        finally:
            # FastAPI runs this after the response has been sent, the last chunk of a stream included.
            lifecycle.request_finished()

    return admit
