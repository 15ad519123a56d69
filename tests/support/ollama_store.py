"""An Ollama model store laid out as Ollama lays it out, for the tests of `ollama:` models."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path


def ollama_store(
    root: Path, name: str, tag: str, blob: bytes | Path, namespace: str = "registry.ollama.ai/library"
) -> Path:
    """A store laid out as Ollama lays it out: an OCI manifest per model and tag, content-addressed blobs. `blob`: the
    model layer's bytes, or a file hard-linked in (copied where it is on another file system)."""
    digest = hashlib.sha256(blob).hexdigest() if isinstance(blob, bytes) else _sha256(blob)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    stored = root / "blobs" / f"sha256-{digest}"
    if isinstance(blob, bytes):
        stored.write_bytes(blob)
    elif os.stat(blob).st_dev == os.stat(stored.parent).st_dev:
        os.link(blob, stored)
    else:
        shutil.copyfile(blob, stored)
    manifest = root / "manifests" / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {
            "mediaType": "application/vnd.ollama.image.model",
            "digest": f"sha256:{digest}",
            "size": stored.stat().st_size,
        },
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return stored


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
