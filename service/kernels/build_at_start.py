"""Builds the service's kernels at start for the CPU the service runs on, where none is built for it and the llama.cpp
source is at hand (SERVICE_KERNEL_SOURCE: the images carry it). The kernels are compiled for the CPU (-march=native)
and an image runs on CPUs it was not built on, so an image builds them once per CPU flags set, into the cache
(SERVICE_GGML_KERNEL_DIR, on its cache volume), or copies the build the image carries for its build machine's CPU
where this CPU has the same flags (SERVICE_SHIPPED_KERNEL_DIR). Starts that share the volume take turns on a file
lock: the second finds the first's build. A build whose libraries are not the ones it recorded
(service/cache/verified.py) is said loudly, and rebuilt where the source is at hand. A build that fails is logged
loudly; the policy then says the kernels are not built and names what runs instead."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from email.parser import Parser
from pathlib import Path

from service.facts.software import (
    BUILT_FILES,
    GGML_KERNEL_DIR,
    NOT_BUILT,
    SHIPPED_KERNEL_DIR,
    UNRECORDED,
    ggml_kernel_problem,
)

log = logging.getLogger("service.kernels")
BUILD_TIMEOUT_S = 1800  # a minute or two on 2 cores; a compiler that hangs must not hold the start forever
AT_START = "built by the service at its first start on this CPU"
WITH_THE_IMAGE = "built with the image, on its build machine's CPU"


def built_from(source: Path) -> str:
    """What a build from `source` says it was built from: the sdist's name and version where the tree sits in one
    (vendor/llama.cpp of llama-cpp-python, as `make kernels` builds it), else the tree's path."""
    try:
        meta = Parser().parsestr((source.parents[1] / "PKG-INFO").read_text(), headersonly=True)
        origin = f"{meta['Name']} {meta['Version']}" if meta["Name"] and meta["Version"] else str(source)
    except (OSError, IndexError):
        origin = str(source)
    return f"ggml from {origin}, {AT_START}"


def build_at_start(
    mode: str,  # Settings.build_kernels: auto | off
    source: Path | None,
    problem: Callable[[], str | None] = ggml_kernel_problem,
    kernel_dir: Path = GGML_KERNEL_DIR,
    shipped: Path | None = SHIPPED_KERNEL_DIR,
) -> str | None:
    """Builds the kernels when this CPU has none (or a build that is not as recorded) and `mode` allows it, or copies
    the image's own build where `shipped` has one for this CPU's flags. What happened is logged once (an error when the
    build failed or cannot be loaded) and returned (None: nothing to do or nothing to build from)."""
    if (why := problem()) is None:
        return None
    if source is None or not (source / "CMakeLists.txt").is_file():
        # A checkout without `make kernels`: the policy's decisions say so; a build that cannot be loaded is said here.
        return None if why == NOT_BUILT else _unloadable(kernel_dir, why)
    if why not in (NOT_BUILT, UNRECORDED):
        log.error("the service's kernels in %s cannot be loaded, rebuilding them: %s", kernel_dir, why)
    if mode == "off":
        return _said(
            f"the service's kernels are not built for this CPU ({why}) and build_kernels=off: not building them from "
            f"{source}"
        )
    kernel_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(kernel_dir.parent / f"{kernel_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another start on this cache volume may be building them
        if problem() is None:
            return _said(f"the service's kernels for this CPU were built by another start meanwhile ({kernel_dir})")
        if shipped is not None and (copied := _copy_shipped(shipped / kernel_dir.name, kernel_dir, problem)):
            return _said(copied)
        log.warning(
            "building the service's kernels for this CPU from %s into %s: its first start on this CPU, a minute or "
            "two on a few cores; later starts reuse them",
            source,
            kernel_dir,
        )
        started = time.monotonic()
        try:
            subprocess.run(
                [sys.executable, "-m", "service.kernels.ggml_build", str(source), built_from(source)],
                env={**os.environ, "SERVICE_GGML_KERNEL_DIR": str(kernel_dir.parent)},  # where `problem` looks
                check=True,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.CalledProcessError as exc:
            return _failed(f"exit {exc.returncode}: {(exc.stderr or exc.stdout or '')[-2000:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _failed(str(exc))
        if (why := problem()) is not None:
            return _failed(f"the build finished, but {why}")
    return _said(f"built the service's kernels for this CPU in {time.monotonic() - started:.0f} s ({kernel_dir})")


def _copy_shipped(build: Path, kernel_dir: Path, problem: Callable[[], str | None]) -> str | None:
    """The image's build for this CPU's flags, copied into the cache where it verifies: what was done, or None (none
    shipped for these flags, or the copy is not as recorded: then it is built)."""
    stamp = build / "kernel" / "built.json"
    if ggml_kernel_problem(stamp) is not None:
        return None
    started = time.monotonic()
    staging = kernel_dir.with_name(f"{kernel_dir.name}.copying")
    shutil.rmtree(staging, ignore_errors=True)
    for name in (*BUILT_FILES, "kernel/built.json"):
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(build / name, staging / name)
    shutil.rmtree(kernel_dir, ignore_errors=True)
    staging.rename(kernel_dir)
    if (why := problem()) is not None:
        log.error("the image's kernels for this CPU, copied from %s, cannot be loaded (%s): building them", build, why)
        return None
    return (
        f"copied the service's kernels the image was built with for this CPU's flags from {build} into {kernel_dir} "
        f"in {time.monotonic() - started:.1f} s: no build at start"
    )


def _said(line: str) -> str:
    log.info("%s", line)
    return line


def _unloadable(kernel_dir: Path, why: str) -> str:
    line = (
        f"the service's kernels in {kernel_dir} cannot be loaded, vLLM's kernels run instead: {why}. Rebuild them "
        "(make kernels)"
    )
    log.error("%s", line)
    return line


def _failed(why: str) -> str:
    line = f"building the service's kernels for this CPU failed, vLLM's kernels run instead: {why}"
    log.error("%s", line)
    return line
