"""Shared libraries the engine processes can preload: tcmalloc, Intel OpenMP and torch's GNU OpenMP.

Located on disk only (nothing is loaded or imported): the preload policy decides which of them to use.
"""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Debian's libtcmalloc-minimal4 ships only the runtime soname; the full gperftools package adds libtcmalloc.
TCMALLOC_PATTERNS = ("libtcmalloc_minimal.so*", "libtcmalloc.so*")
IOMP_PATTERNS = ("libiomp5.so",)
GOMP_PATTERNS = ("libgomp*.so*",)


@dataclass(frozen=True)
class LibraryFacts:
    tcmalloc: Path | None  # system tcmalloc (Debian: libtcmalloc-minimal4), or vLLM's bundled copy
    iomp5: Path | None  # Intel OpenMP, from the intel-openmp wheel vLLM installs into <prefix>/lib
    torch_gomp: Path | None  # the GNU OpenMP runtime torch bundles (and links against)


def system_lib_dirs(root: Path = Path("/")) -> tuple[Path, ...]:
    """Where the dynamic loader finds distribution libraries (Debian's multiarch directories first)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    rel = (f"usr/lib/{multiarch}", f"lib/{multiarch}", "usr/lib64", "lib64", "usr/lib", "lib", "usr/local/lib")
    return tuple(root / r for r in rel)


def _package_dir(name: str) -> Path | None:
    """A package's directory without importing it (importing torch or vLLM here would load OpenMP itself)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_first(dirs: tuple[Path, ...], patterns: tuple[str, ...]) -> Path | None:
    """First match by pattern order, then directory order; the shortest name (the soname, not the
    fully versioned file) among one directory's matches."""
    for pattern in patterns:
        for d in dirs:
            matches = sorted(d.glob(pattern), key=lambda p: (len(p.name), p.name)) if d.is_dir() else []
            if matches:
                return matches[0]
    return None


def read_libraries(
    root: Path = Path("/"),
    prefix: Path | None = None,
    torch_dir: Path | None = None,
    vllm_dir: Path | None = None,
) -> LibraryFacts:
    """Live machine by default; tests pass a root and package directories laid out like the real ones."""
    prefix = Path(sys.prefix) if prefix is None else prefix
    torch_dir = _package_dir("torch") if torch_dir is None else torch_dir
    vllm_dir = _package_dir("vllm") if vllm_dir is None else vllm_dir
    # vLLM's platform looks for a bundled tcmalloc in vllm/libs (upstream wheels); the system copy comes first.
    tcmalloc_dirs = system_lib_dirs(root) + ((vllm_dir / "libs",) if vllm_dir else ())
    # torch wheels keep it in torch/lib, auditwheel-repaired ones in torch.libs (vllm/platforms/cpu.py looks in both).
    gomp_dirs = (torch_dir / "lib", torch_dir.parent / "torch.libs") if torch_dir else ()
    return LibraryFacts(
        tcmalloc=find_first(tcmalloc_dirs, TCMALLOC_PATTERNS),
        iomp5=find_first((prefix / "lib",), IOMP_PATTERNS),
        torch_gomp=find_first(gomp_dirs, GOMP_PATTERNS),
    )
