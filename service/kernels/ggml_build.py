"""Builds the service's kernel library for the CPU it runs on (-march=native): ggml's CPU library from a llama.cpp
source tree, without OpenMP since torch's thread pool calls it, and llama.cpp's own library (libllama, the GGUF check's
reference: service/models/llama_cpp_reference.py), then the torch op library over ggml (ggml_linear.cpp against ggml,
and bf16_linear.cpp). Every build starts from empty folders, configured from the tree: nothing a build leaves in the
cache (a build.ninja, an object file) is run or linked by the next. `make kernels` runs it on a checkout, the service
at start where its image carries the source (service/kernels/build_at_start.py):
`python -m service.kernels.ggml_build <llama.cpp tree> <built from> [avx2]`; `avx2` builds for AVX2 alone (haswell)
instead of this CPU, for the AVX2 emulation of the tests (tests/support/avx2_emulation).
torch's extension builder compiles the op library with torch's own headers and ABI; the stamp written last records
each library's sha256, which the service's software facts check (service/facts/software.py ggml_kernel_built) and
every load checks again (service/cache/verified.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from service.cache.atomic_dir import replace_file
from service.cache.verified import record
from service.facts.software import BUILT_FILES, GGML_KERNEL_BUILT, GGML_KERNEL_DIR, GGML_KERNEL_LIBRARY

SOURCES = [str(Path(__file__).with_name(name)) for name in ("ggml_linear.cpp", "bf16_linear.cpp")]
# ggml and llama.cpp's library: the rest of llama.cpp (its tools, tests, examples) is neither configured nor built.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_OPENMP=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
)

# Per target: ggml's ISA options and the op library's -march. ggml without GGML_NATIVE builds none of AVX-512's paths.
TARGETS = {
    "native": (("-DGGML_NATIVE=ON",), "-march=native"),
    "avx2": (
        ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"),
        "-march=haswell",
    ),
}


def beside_python(tool: str) -> str:
    """`tool` beside this Python (cmake's and ninja's wheels: dependencies of the service and of vLLM), else PATH's."""
    beside = Path(sys.executable).with_name(tool)
    return str(beside) if beside.is_file() else (shutil.which(tool) or tool)


def build_ggml(tree: Path, out: Path, target: str = "native") -> Path:
    """ggml's and llama.cpp's shared libraries for `target`, built afresh from `tree` under `out`; the directory that
    holds them."""
    build_dir = out / "build"
    shutil.rmtree(build_dir, ignore_errors=True)  # a tree configured by another generator or source is refused
    cmake = beside_python("cmake")
    # Ninja: the images have no make.
    generator = ("-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={beside_python('ninja')}")
    configure = [cmake, "-S", str(tree), "-B", str(build_dir), *generator, *CMAKE_OPTIONS, *TARGETS[target][0]]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    jobs = str(len(os.sched_getaffinity(0)))
    subprocess.run(
        [cmake, "--build", str(build_dir), "-j", jobs, "--target", "ggml", "llama"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return (build_dir / "bin").resolve()


def build(tree: Path, built_from: str, target: str = "native") -> None:
    from torch.utils.cpp_extension import load

    GGML_KERNEL_BUILT.unlink(missing_ok=True)  # a build under way is not a build to load
    libraries = build_ggml(tree, GGML_KERNEL_DIR, target)
    # Afresh: torch's builder keeps object files its ninja finds newer than their sources (and the stamp goes with them).
    shutil.rmtree(GGML_KERNEL_LIBRARY.parent, ignore_errors=True)
    GGML_KERNEL_LIBRARY.parent.mkdir(parents=True)
    load(
        name=GGML_KERNEL_LIBRARY.stem,
        sources=SOURCES,
        extra_include_paths=[str((tree / "ggml" / "include").resolve())],
        # -fopenmp: at::parallel_for is OpenMP in torch's headers; without it the slices run one after the other.
        # The library then shares torch's libgomp (same soname, already loaded), so its threads are the engine's.
        extra_cflags=["-O3", TARGETS[target][1], "-fopenmp"],
        # rpath: the library finds ggml where it was built, in every vLLM process, without LD_LIBRARY_PATH
        extra_ldflags=[f"-L{libraries}", "-lggml", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{libraries}", "-fopenmp"],
        build_directory=str(GGML_KERNEL_LIBRARY.parent),
        is_python_module=False,
    )
    stamp = {"built_from": built_from, "files": record(GGML_KERNEL_DIR, BUILT_FILES)}
    replace_file(GGML_KERNEL_BUILT, json.dumps(stamp, indent=1).encode())


if __name__ == "__main__":
    build(Path(sys.argv[1]), sys.argv[2], *sys.argv[3:4])
