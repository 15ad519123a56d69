"""An Ollama model store laid out as Ollama lays it out, for the tests of `ollama:` models."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def ollama_store(root: Path, name: str, tag: str, blob: bytes, namespace: str = "registry.ollama.ai/library") -> Path:
    """A store laid out as Ollama lays it out: an OCI manifest per model and tag, content-addressed blobs."""
    digest = hashlib.sha256(blob).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(blob)
    manifest = root / "manifests" / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(blob)},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return root / "blobs" / f"sha256-{digest}"
