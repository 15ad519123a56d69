"""Ollama's local model store: `ollama:NAME[:TAG]` -> the GGUF blob Ollama pulled, read in place.

Ollama keeps a manifest per model under `$OLLAMA_MODELS/manifests/<registry>/<namespace>/<name>/<tag>` (an OCI image
manifest) and its layers as content-addressed blobs, `$OLLAMA_MODELS/blobs/sha256-<hex>`; the layer of media type
`application/vnd.ollama.image.model` is the model's GGUF file (ollama/server/modelpath.go, server/images.go).

The name and the manifest's digest become paths: both are checked first (a name of the parts and characters Ollama
allows, a digest `sha256:<64 hex digits>`), and the blob must lie in `blobs/`, symlinks resolved. Its content is
checked against the digest by the start-up, with the sha256 its GGUF facts carry (kept between starts, so that a
blob of gigabytes is hashed once per version, not at every start).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PREFIX = "ollama:"
MODEL_LAYER = "application/vnd.ollama.image.model"
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
# The characters of a name's parts (Ollama's types/model/name.go, isValidByteFor); a namespace has no "." there.
_NAME_PART = re.compile(r"[A-Za-z0-9_.-]+")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class OllamaModelNotFound(ValueError):
    pass


@dataclass(frozen=True)
class OllamaModel:
    name: str  # as asked, without the prefix: "qwen3:0.6b"
    manifest: Path
    blob: Path  # the GGUF file, served where it lies
    sha256: str  # its content's hash, as the manifest's digest names it


def models_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """OLLAMA_MODELS, else Ollama's default for the user (~/.ollama/models)."""
    return Path(environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def manifest_path(name: str, root: Path) -> Path:
    """Ollama's naming: `model[:tag]`, `namespace/model[:tag]`, or `host/namespace/model[:tag]` (hf.co/org/name:Q4)."""
    return root.joinpath("manifests", *name_parts(name))


def name_parts(name: str) -> list[str]:
    """[host, namespace, model, tag], Ollama's defaults filled in; OllamaModelNotFound for a name Ollama would not
    take, which could name a path outside the store: a part empty (an absolute name's first), `.` or `..`, a
    character Ollama does not allow, more than three parts."""
    *head, last = name.split("/")
    model, _, tag = last.partition(":")
    given = [*head, model]
    parts = [DEFAULT_REGISTRY, DEFAULT_NAMESPACE][: max(3 - len(given), 0)] + given + [tag or DEFAULT_TAG]
    bad = [p for p in parts if not _NAME_PART.fullmatch(p) or ".." in p or p == "."]
    if len(given) > 3 or bad or "." in parts[1]:
        raise OllamaModelNotFound(
            f"{name!r} is not an Ollama model name: [host/][namespace/]model[:tag], each part letters, digits, "
            "'_', '-' and '.' (none in the namespace), never '.' or '..'"
        )
    return parts


def find_ollama_model(name: str, root: Path) -> OllamaModel:
    manifest = manifest_path(name, root)
    if not manifest.is_file():
        listed = (root / "manifests").rglob("*") if (root / "manifests").is_dir() else ()
        have = sorted(str(p.relative_to(root / "manifests")) for p in listed if p.is_file())
        raise OllamaModelNotFound(
            f"Ollama has no model {name!r} in {root} (no manifest {manifest})"
            + (f"; it has: {', '.join(have)}" if have else "; set OLLAMA_MODELS to Ollama's model directory")
        )
    digest = model_digest(manifest)
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise OllamaModelNotFound(f"{manifest} names the blob {blob}, which is missing: `ollama pull {name}` again")
    blobs = (root / "blobs").resolve()
    if not blob.resolve().is_relative_to(blobs):
        raise OllamaModelNotFound(
            f"the blob {blob} links to {blob.resolve()}, outside Ollama's blobs ({blobs}): refused"
        )
    return OllamaModel(name, manifest, blob, digest.removeprefix("sha256:"))


def model_digest(manifest: Path) -> str:
    """The digest of the manifest's model layer, checked before it names a blob: `sha256:<64 hex digits>`."""
    layers = json.loads(manifest.read_text()).get("layers", [])
    digest = next((layer.get("digest") for layer in layers if layer.get("mediaType") == MODEL_LAYER), None)
    if digest is None:
        raise OllamaModelNotFound(f"{manifest} names no model layer ({MODEL_LAYER})")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise OllamaModelNotFound(
            f"{manifest} names the model layer's digest {digest!r}, not sha256:<64 hexadecimal digits>: refused"
        )
    return digest
