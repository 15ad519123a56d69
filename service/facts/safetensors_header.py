"""One safetensors file's header (8 bytes of length, then JSON) -> each tensor's entry, without reading the weights;
what keeps it from loading is a ValueError naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# How a file Git LFS stands in for starts (its pointer format, "version https://git-lfs.github.com/spec/v1").
_LFS_POINTER = b"version https://git-lfs"


def read_header(path: Path) -> dict[str, dict[str, Any]]:
    """Each tensor's header entry (dtype, shape, data_offsets). ValueError when the file is a Git LFS pointer, its
    header or data runs past its end (an interrupted copy), or its header is not the format's."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            first = f.read(len(_LFS_POINTER))
            length = int.from_bytes(first[:8], "little")
            f.seek(8)
            raw = b"" if first == _LFS_POINTER or length > size - 8 else f.read(length)
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    if first == _LFS_POINTER:
        raise ValueError(
            f"{path.name} is a Git LFS pointer, not the weights: the repository was cloned without git-lfs "
            f"(run `git lfs pull` in {path.parent})"
        )
    if length > size - 8:
        raise ValueError(f"{path.name} is truncated: {size:,} bytes, shorter than its own header")
    try:
        entries = {k: v for k, v in json.loads(raw).items() if k != "__metadata__"}
        end = 8 + length + max((int(v["data_offsets"][1]) for v in entries.values()), default=0)
    except (ValueError, AttributeError, KeyError, IndexError, TypeError) as exc:  # not the format's shape
        raise _unreadable(path, exc) from exc
    if end > size:
        raise ValueError(f"{path.name} is truncated: {size:,} bytes, its tensors end at byte {end:,}")
    return entries


def _unreadable(path: Path, exc: Exception) -> ValueError:
    return ValueError(f"{path.name} has no readable safetensors header ({type(exc).__name__}: {exc})")
