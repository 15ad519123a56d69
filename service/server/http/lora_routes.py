"""LoRA adapters of a directory served while the service runs (the lora_dir setting): loaded on the first request
that names one, as vLLM's filesystem resolver and Ollama do, or by hand with `vllm serve`'s routes (its
VLLM_ALLOW_RUNTIME_LORA_UPDATING): POST /v1/load_lora_adapter and /v1/unload_lora_adapter, vLLM's request bodies.

Each adapter is checked before vLLM loads it, as the ones set at start are: its directory must be inside lora_dir
(an API key must not open any path of the server), a PEFT LoRA adapter, no wider than the engine's adapter slots and
made for this model. vLLM itself loads a misfit into the engine and fails there, naming neither adapter nor layer.
The adapters set at start stay: /v1/hardware's decisions describe them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

from service.facts.lora import AdapterFacts, read_adapter
from service.facts.model import ModelFacts
from service.policy.engine.lora import adapter_misfit
from service.server.openai_compat.errors import ServiceError

log = logging.getLogger("service.lora")

# A name clients put in `model`: checked before the service keeps anything for it (a lock per name, once kept for
# ever, grew by every refused request: 50 of them held 5 MB of names).
NAME = re.compile(r"[\w.\-/:@+]{1,128}")
OFF = "loading LoRA adapters while serving is off: set lora_dir (SERVICE_LORA_DIR) to the directory that holds them"


def _invalid(message: str, param: str) -> ServiceError:
    return ServiceError(HTTPStatus.BAD_REQUEST, message, "BadRequestError", param=param)


def inside(directory: Path, given: str) -> Path | None:
    """`given` (relative to `directory`, or absolute) as an absolute path, if it names something inside `directory`.
    Lexical: a symlink the operator put in the directory is theirs to follow; `..` out of it is refused."""
    root = Path(os.path.normpath(directory.absolute()))
    path = Path(os.path.normpath(root / given))
    return path if path != root and path.is_relative_to(root) else None


def named_dir(directory: Path, name: str) -> Path | None:
    """The directory inside `directory` that a request's `model` names: a relative path as written (`sql`,
    `team/sql`), so one adapter has one name (not also `./sql` or `sql/`)."""
    path = inside(directory, name)
    root = Path(os.path.normpath(directory.absolute()))
    return path if path is not None and path.relative_to(root).as_posix() == name else None


class AdapterLoader:
    """Checks an adapter inside lora_dir and hands it to vLLM: for the load route, and for a request whose `model`
    names an adapter of lora_dir not loaded yet. Loads hold the name's lock, so concurrent first requests load it
    once."""

    def __init__(self, lora_dir: Path, model: ModelFacts, max_lora_rank: int) -> None:
        self.lora_dir, self.model, self.max_lora_rank = lora_dir, model, max_lora_rank
        self.fixed = {a.name for a in model.lora_adapters}
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # name -> (its lock, [holders and waiters])

    async def load(self, models: Any, body: LoadLoRAAdapterRequest, path_param: str) -> AdapterFacts:
        """Raises a ServiceError in the OpenAI shape (400 naming `path_param` for an adapter that cannot be served)."""
        name = body.lora_name
        path = self.checked(name, body.lora_path, path_param)
        try:
            adapter = await asyncio.to_thread(read_adapter, name, path)  # file reads, off the event loop
        except ValueError as exc:
            raise _invalid(str(exc), path_param) from exc
        if (misfit := adapter_misfit(adapter, self.model, self.max_lora_rank)) is not None:
            raise _invalid(misfit, path_param)
        answer = await models.load_lora_adapter(body.model_copy(update={"lora_path": str(path)}))
        _raise_refusal(answer, models, name, path_param)
        return adapter

    @contextlib.asynccontextmanager
    async def lock(self, name: str) -> AsyncIterator[None]:
        """The name's lock, kept only while someone holds or waits for it."""
        lock, users = self._locks.setdefault(name, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[name]

    def locks_kept(self) -> int:
        return len(self._locks)

    def checked(self, name: str, lora_path: str, path_param: str) -> Path:
        """Refusals that need no state: a name clients cannot send as it is, a path outside lora_dir."""
        if not NAME.fullmatch(name):
            raise _invalid(
                f"lora_name must be 1-128 letters, digits or . _ - / : @ +, not {name[:40]!r}"
                f"{'...' if len(name) > 40 else ''}",
                "lora_name",
            )
        path = inside(self.lora_dir, lora_path)
        if path is None:
            raise _invalid(f"lora_path {lora_path[:200]!r} is not inside lora_dir ({self.lora_dir})", path_param)
        return path

    async def load_on_first_use(self, request: Request) -> None:
        """A dependency of the engine routes, after admission has parsed the body. Loading on first use (as vLLM's
        filesystem resolver and Ollama do) lets every replica serve the adapters of a shared lora_dir without a
        load call to each."""
        body = getattr(request.state, "json_body", None)
        name = body.get("model") if isinstance(body, dict) else None
        models = getattr(request.app.state, "openai_serving_models", None)
        if not isinstance(name, str) or models is None or models.is_base_model(name) or name in models.lora_requests:
            return
        path = named_dir(self.lora_dir, name)
        if path is None or not await asyncio.to_thread(_holds_adapter, path):
            return  # not an adapter of lora_dir: vLLM answers 404, listing the models
        async with self.lock(name):
            if name in models.lora_requests:  # a concurrent request loaded it
                return
            await self.load(models, LoadLoRAAdapterRequest(lora_name=name, lora_path=name), "model")
        log.info("loaded LoRA adapter %r from %s on its first request", name, path)


def _holds_adapter(path: Path) -> bool:
    try:
        return (path / "adapter_config.json").is_file()
    except (OSError, ValueError):  # a name the filesystem cannot take (too long, a NUL)
        return False


def _raise_refusal(answer: Any, models: Any, name: str, param: str) -> None:
    if isinstance(answer, str):  # vLLM's success is a sentence
        return
    status = HTTPStatus(answer.error.code)
    if status == HTTPStatus.INTERNAL_SERVER_ERROR and not models.engine_client.errored:
        # The engine refused the adapter and serves on (e.g. a layer width these checks cannot see): the
        # adapter's fault, not the server's, as vLLM's 500 would say.
        raise _invalid(f"LoRA adapter {name!r} could not be loaded: {answer.error.message}", param)
    raise ServiceError(status, answer.error.message, answer.error.type, param=answer.error.param)


def _loader(request: Request, name: str) -> AdapterLoader:
    """The app's loader (create_app serves these routes only with one), refusing the adapters set at start."""
    loader: AdapterLoader = request.app.state.lora_loader
    if name in loader.fixed:
        raise _invalid(f"LoRA adapter {name!r} was set at start (lora_adapters); it stays while serving", "lora_name")
    return loader


async def load(body: LoadLoRAAdapterRequest, request: Request) -> Response:
    """Load a LoRA adapter from a directory inside lora_dir; clients then name it in `model`."""
    name = body.lora_name.strip()
    if not name:
        raise _invalid("lora_name is empty: give the name requests will use for the adapter", "lora_name")
    models = request.app.state.openai_serving_models
    if models.is_base_model(name):
        raise _invalid(f"{name!r} is the served model's own name; give the adapter another", "lora_name")
    loader = _loader(request, name)
    loader.checked(name, body.lora_path, "lora_path")
    async with loader.lock(name):
        adapter = await loader.load(models, body.model_copy(update={"lora_name": name}), "lora_path")
    card = next(c for c in (await models.show_available_models()).data if c.id == name)
    return JSONResponse(card.model_dump() | {"rank": adapter.rank})


async def unload(body: UnloadLoRAAdapterRequest, request: Request) -> Response:
    """Unload an adapter loaded while serving; requests already running with it finish with it."""
    _loader(request, body.lora_name)
    models = request.app.state.openai_serving_models
    _raise_refusal(await models.unload_lora_adapter(body), models, body.lora_name, "lora_name")
    return JSONResponse({"id": body.lora_name, "object": "model", "deleted": True})
