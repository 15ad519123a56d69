"""A GGUF file's facts kept on disk between starts.

Reading them parses the header twice (gguf-py's reader, then transformers' mapping builds its own) and hashes the
whole file: 8.5 s of a 9.5 s `python -m service detect` on the default model's 100 MB file, on every start, and the
hash alone grows with the file. The stored copy is keyed by the file's path, size and modification time and by what
read it (the reading code and the gguf and transformers versions), so any change to either reads the file again.
A missing, stale or unreadable entry is read again; an unwritable cache only costs the next start the read.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from service.cache.atomic_dir import replace_file
from service.facts import gguf
from service.facts.gguf import GgufFacts

DIRECTORY = "gguf-facts"
_ADAPTER = TypeAdapter(GgufFacts)


def read_gguf(path: Path, cache_dir: Path) -> GgufFacts:
    """`gguf.read_gguf(path)`, from the cache when this version of the file was read before."""
    stat = path.stat()
    file = entry(cache_dir, path, stat.st_size, stat.st_mtime_ns, reader())
    facts = load(file)
    if facts is None:
        facts = gguf.read_gguf(path)
        store(file, facts)
    return facts


@functools.cache
def reader() -> str:
    """The reading code's fingerprint: service/facts/gguf.py itself and the libraries it reads with."""
    versions = [importlib.metadata.version(name) for name in ("gguf", "transformers")]
    return hashlib.sha256(Path(gguf.__file__).read_bytes() + json.dumps(versions).encode()).hexdigest()


def entry(cache_dir: Path, path: Path, size: int, mtime_ns: int, reader: str) -> Path:
    """Where the facts of this version of `path`, as `reader` (a fingerprint of the reading code) reads it, live."""
    key = json.dumps([str(path), size, mtime_ns, reader])
    return cache_dir / DIRECTORY / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def load(file: Path) -> GgufFacts | None:
    try:
        return _ADAPTER.validate_json(file.read_bytes())
    except (OSError, ValidationError):
        return None


def store(file: Path, facts: GgufFacts) -> None:
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        replace_file(file, _ADAPTER.dump_json(facts))  # unique staging: replicas on one cache write side by side
    except OSError:
        return
