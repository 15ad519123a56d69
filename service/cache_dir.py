"""Whether the cache dir can be written: the service keeps the demo model, converted GGUF files, its kernels, the
calibration's timings and torch.compile's graphs there. Where it could not, the demo model's build ended in a
traceback, and a GGUF file's conversion failed only after the whole report."""

from __future__ import annotations

import tempfile
from pathlib import Path


def cache_dir_problem(cache_dir: Path) -> str | None:
    """Why `cache_dir` cannot hold the service's files (created if missing), or None."""
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache_dir):
            pass
    except OSError as exc:
        return (
            f"cache_dir {str(cache_dir)!r} is not a writable directory ({exc.strerror or exc}): the service keeps "
            "converted models, its kernels and compiled graphs there; set SERVICE_CACHE_DIR to one it may write "
            "(in a container, mount a volume there)"
        )
    return None
