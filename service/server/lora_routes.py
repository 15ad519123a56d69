"""Loading and unloading LoRA adapters while serving (the lora_dir setting), as `vllm serve` does with
VLLM_ALLOW_RUNTIME_LORA_UPDATING: POST /v1/load_lora_adapter and /v1/unload_lora_adapter, vLLM's request bodies.

Each adapter is checked before vLLM loads it, as the ones set at start are: its directory must be inside lora_dir
(an API key must not open any path of the server), a PEFT LoRA adapter, no wider than the engine's adapter slots and
made for this model. vLLM itself loads a misfit into the engine and fails there, naming neither adapter nor layer.
The adapters set at start stay: /v1/hardware's decisions describe them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

from service.facts.lora import read_adapter
from service.facts.model import ModelFacts
from service.policy.lora import adapter_misfit
from service.server.errors import ServiceError
from service.server.routes import LOAD_LORA, UNLOAD_LORA

OFF = "loading LoRA adapters while serving is off: set lora_dir (SERVICE_LORA_DIR) to the directory that holds them"


def _invalid(message: str, param: str) -> ServiceError:
    return ServiceError(HTTPStatus.BAD_REQUEST, message, "BadRequestError", param=param)


def inside(directory: Path, given: str) -> Path | None:
    """`given` (relative to `directory`, or absolute) as an absolute path, if it names something inside `directory`.
    Lexical: a symlink the operator put in the directory is theirs to follow; `..` out of it is refused."""
    root = Path(os.path.normpath(directory.absolute()))
    path = Path(os.path.normpath(root / given))
    return path if path != root and path.is_relative_to(root) else None


def lora_handlers(
    lora_dir: Path, model: ModelFacts, max_lora_rank: int
) -> dict[str, Callable[..., Coroutine[Any, Any, Response]]]:
    fixed = {a.name for a in model.lora_adapters}

    def _vllm_answer(answer: Any, models: Any, name: str) -> JSONResponse | None:
        if isinstance(answer, str):  # vLLM's success is a sentence
            return None
        if answer.error.code == HTTPStatus.INTERNAL_SERVER_ERROR and not models.engine_client.errored:
            # The engine refused the adapter and serves on (e.g. a layer width these checks cannot see): the
            # adapter's fault, not the server's, as vLLM's 500 would say.
            raise _invalid(f"LoRA adapter {name!r} could not be loaded: {answer.error.message}", "lora_path")
        return JSONResponse(answer.model_dump(), status_code=answer.error.code)

    async def load(body: LoadLoRAAdapterRequest, request: Request) -> Response:
        """Load a LoRA adapter from a directory inside lora_dir; clients then name it in `model`."""
        name = body.lora_name.strip()
        if not name:
            raise _invalid("lora_name is empty: give the name requests will use for the adapter", "lora_name")
        models = request.app.state.openai_serving_models
        if models.is_base_model(name):
            raise _invalid(f"{name!r} is the served model's own name; give the adapter another", "lora_name")
        if name in fixed:
            raise _invalid(
                f"LoRA adapter {name!r} was set at start (lora_adapters); it stays while serving", "lora_name"
            )
        path = inside(lora_dir, body.lora_path)
        if path is None:
            raise _invalid(f"lora_path {body.lora_path!r} is not inside lora_dir ({lora_dir})", "lora_path")
        try:
            adapter = await asyncio.to_thread(read_adapter, name, path)  # file reads, off the event loop
        except ValueError as exc:
            raise _invalid(str(exc), "lora_path") from exc
        if (misfit := adapter_misfit(adapter, model, max_lora_rank)) is not None:
            raise _invalid(misfit, "lora_path")
        checked = body.model_copy(update={"lora_name": name, "lora_path": str(path)})
        if (refused := _vllm_answer(await models.load_lora_adapter(checked), models, name)) is not None:
            return refused
        card = next(c for c in (await models.show_available_models()).data if c.id == name)
        return JSONResponse(card.model_dump() | {"rank": adapter.rank})

    async def unload(body: UnloadLoRAAdapterRequest, request: Request) -> Response:
        """Unload an adapter loaded while serving; requests already running with it finish with it."""
        if body.lora_name in fixed:
            raise _invalid(
                f"LoRA adapter {body.lora_name!r} was set at start (lora_adapters); it stays while serving", "lora_name"
            )
        models = request.app.state.openai_serving_models
        if (refused := _vllm_answer(await models.unload_lora_adapter(body), models, body.lora_name)) is not None:
            return refused
        return JSONResponse({"id": body.lora_name, "object": "model", "deleted": True})

    return {LOAD_LORA: load, UNLOAD_LORA: unload}
