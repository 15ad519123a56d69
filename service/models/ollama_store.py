"""Ollama's local model store: `ollama:NAME[:TAG]` -> the GGUF blob Ollama pulled, read in place.

Ollama keeps a manifest per model under `$OLLAMA_MODELS/manifests/<registry>/<namespace>/<name>/<tag>` (an OCI image
manifest) and its layers as content-addressed blobs, `$OLLAMA_MODELS/blobs/sha256-<hex>`; the layer of media type
`application/vnd.ollama.image.model` is the model's GGUF file (ollama/server/modelpath.go, server/images.go).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PREFIX = "ollama:"
MODEL_LAYER = "application/vnd.ollama.image.model"
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"


class OllamaModelNotFound(ValueError):
    pass


@dataclass(frozen=True)
class OllamaModel:
    name: str  # as asked, without the prefix: "qwen3:0.6b"
    manifest: Path
    blob: Path  # the GGUF file, served where it lies


def models_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """OLLAMA_MODELS, else Ollama's default for the user (~/.ollama/models)."""
    return Path(environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def manifest_path(name: str, root: Path) -> Path:
    """Ollama's naming: `model[:tag]`, `namespace/model[:tag]`, or `host/namespace/model[:tag]` (hf.co/org/name:Q4)."""
    head, _, last = name.rpartition("/")
    model, _, tag = last.partition(":")
    parts = [*head.split("/"), model] if head else [model]
    if len(parts) == 1:
        parts = [DEFAULT_REGISTRY, DEFAULT_NAMESPACE, *parts]
    elif len(parts) == 2:
        parts = [DEFAULT_REGISTRY, *parts]
    return root.joinpath("manifests", *parts, tag or DEFAULT_TAG)


def find_ollama_model(name: str, root: Path) -> OllamaModel:
    manifest = manifest_path(name, root)
    if not manifest.is_file():
        listed = (root / "manifests").rglob("*") if (root / "manifests").is_dir() else ()
        have = sorted(str(p.relative_to(root / "manifests")) for p in listed if p.is_file())
        raise OllamaModelNotFound(
            f"Ollama has no model {name!r} in {root} (no manifest {manifest})"
            + (f"; it has: {', '.join(have)}" if have else "; set OLLAMA_MODELS to Ollama's model directory")
        )
    layers = json.loads(manifest.read_text()).get("layers", [])
    digest = next((layer["digest"] for layer in layers if layer.get("mediaType") == MODEL_LAYER), None)
    if digest is None:
        raise OllamaModelNotFound(f"{manifest} names no model layer ({MODEL_LAYER})")
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise OllamaModelNotFound(f"{manifest} names the blob {blob}, which is missing: `ollama pull {name}` again")
    return OllamaModel(name, manifest, blob)
