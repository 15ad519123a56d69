"""Whether the cache dir can be written, and whether anyone but the service's user could change what the service loads
as code: the service keeps the demo model, converted GGUF files, its kernels, the calibration's timings and
torch.compile's graphs there, and loads the kernels and graphs as code, as it does from the folders that may lie
elsewhere (the kernels', vLLM's and Inductor's caches). Each of those folders, every folder and file beneath it, and
every folder above it must be the service's user's or root's and writable by no other user; a folder above may be
sticky instead (/tmp: others add entries, and cannot replace the service's). Where it could not write, the demo model's
build ended in a traceback, and a GGUF file's conversion failed only after the whole report; where another user could
change a file beneath any of them, that user could run code in the service."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

# Where the service or vLLM load code from outside cache_dir, by the variable that moves each.
CODE_VARIABLES = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")


def code_dirs(kernel_root: Path, environ: Mapping[str, str] = os.environ) -> dict[str, Path]:
    """{variable that sets it: folder} of the folders the service loads code from besides cache_dir: its kernels'
    (`kernel_root`, SERVICE_GGML_KERNEL_DIR) and the compile caches the environment moves."""
    dirs = {"SERVICE_GGML_KERNEL_DIR": kernel_root}
    dirs.update({name: Path(environ[name]) for name in CODE_VARIABLES if environ.get(name)})
    return dirs


def cache_dir_problem(cache_dir: Path, elsewhere: Mapping[str, Path] | None = None) -> str | None:
    """Why `cache_dir` cannot hold the service's files (created if missing), or why another user could change what
    the service loads from it or from `elsewhere` (code_dirs), or None."""
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
    for variable, root in {"SERVICE_CACHE_DIR": Path(cache_dir), **(elsewhere or {})}.items():
        if (problem := tree_problem(root, variable)) is not None:
            return problem
    return None


def tree_problem(root: Path, variable: str) -> str | None:
    """Why another user could change what the service loads from `root` (set by `variable`), or None. A `root` not
    made yet is judged by the folders above it, in which it will be made."""
    root = Path(root).resolve()  # what is loaded: a link's target
    for above in reversed(root.parents):
        if (why := _changeable(above, sticky_counts=True)) is not None:
            return _refusal(above, why, root, variable, recursive=False)
    for path in _tree(root):
        if (why := _changeable(path, sticky_counts=False)) is not None:
            return _refusal(path, why, root, variable, recursive=True)
    return None


def _tree(root: Path) -> Iterator[Path]:
    """`root` and every folder and file beneath it, links not followed (nor judged: a link cannot be changed, only
    replaced by whoever may write its folder)."""
    if not root.is_dir():
        return
    yield root
    for folder, subfolders, files in os.walk(root):
        for name in [*subfolders, *files]:
            if not os.path.islink(path := os.path.join(folder, name)):
                yield Path(path)


def _changeable(path: Path, sticky_counts: bool) -> str | None:
    """Why a user other than the service's (or root) could change `path`, or None (also where it does not exist).
    Group-writable stays allowed for the service's own group (Kubernetes' fsGroup volumes are root's, group-writable by
    the pod's group)."""
    try:
        info = path.lstat()
    except OSError:
        return None
    if info.st_uid not in (os.geteuid(), 0):
        return f"it belongs to uid {info.st_uid}, not the service's user ({os.geteuid()})"
    if sticky_counts and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX:
        return None
    if info.st_mode & stat.S_IWOTH:
        return "any user may write it (mode o+w)"
    if info.st_mode & stat.S_IWGRP and info.st_gid not in (os.getegid(), 0):
        return f"group {info.st_gid}, not the service's ({os.getegid()}), may write it"
    return None


def _refusal(path: Path, why: str, root: Path, variable: str, recursive: bool) -> str:
    fix = (
        f"`chown -R {os.geteuid()} {root}; chmod -R go-w {root}`"
        if recursive
        else f"`chmod go-w {path}` (owned by {os.geteuid()} or root)"
    )
    return (
        f"{path} may be changed by another user: {why}. The service loads code from {root} ({variable}: its "
        f"kernels, compiled graphs); {fix}, or set {variable} to a directory of its own"
    )
