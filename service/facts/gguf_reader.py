"""One parse of a GGUF file's header per use, shared by gguf-py's callers and transformers' GGUF loaders.

gguf-py's `GGUFReader` builds a numpy view per element of every metadata array, so a large vocabulary takes seconds
(3.3 s for SmolLM2's 49 k tokens and 49 k merges on a Zen 4 guest). A GGUF file's first start asked for it four times:
the facts (gguf-py's reader, then transformers' `load_gguf_checkpoint`, which builds its own) and the conversion
(transformers' tokenizer builder, then the tensor copy). transformers imports `gguf.GGUFReader` when it is called,
so within `shared_readers()` every read-only `gguf.GGUFReader(path)` returns one reader per version of the file.
The readers are dropped when the block ends: a reader holds the file mapped and its parsed header.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def shared_readers() -> Iterator[None]:
    import gguf

    if getattr(gguf.GGUFReader, "shared", False):  # an enclosing block already shares them
        yield
        return
    original = gguf.GGUFReader
    gguf.GGUFReader = _sharing(original)  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def _sharing(original: Any) -> Callable[..., Any]:
    readers: dict[tuple[str, int, int], Any] = {}

    def reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        if mode != "r":  # a writable mapping is not shared
            return original(path, mode)
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        if key not in readers:
            readers[key] = original(path)
        return readers[key]

    reader.shared = True  # type: ignore[attr-defined]
    return reader
