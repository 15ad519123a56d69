"""Stands in for llama.cpp's child (service/models/llama_cpp_reference.py CHILD) in its tests: started the same way,
it prints what it was given instead of scores: its environment, its limits, its network namespace, whether it may gain
privileges, and what the links of its library folder read (the memfds it inherited)."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path


def _no_new_privs() -> str:
    status = Path("/proc/self/status").read_text().splitlines()
    return next(line.split()[1] for line in status if line.startswith("NoNewPrivs:"))


def main(gguf: str) -> None:
    libraries = Path(os.environ["LLAMA_CPP_LIB_PATH"])
    limits = ("RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NPROC")
    print(
        json.dumps(
            {
                "gguf": gguf,
                "environ": dict(os.environ),
                "limits": {name: resource.getrlimit(getattr(resource, name)) for name in limits},
                "net": os.readlink("/proc/self/ns/net"),
                "no_new_privs": _no_new_privs(),
                "links": {link.name: link.read_text() for link in sorted(libraries.iterdir())},
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
