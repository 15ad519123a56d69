"""Builds the service's kernel library (ggml_linear.cpp against ggml's CPU library, and bf16_linear.cpp), which `make kernels` has built from
the llama.cpp source first: `python -m service.kernels.ggml_build <llama.cpp tree> <ggml build dir> <built from>`.
torch's extension builder compiles it with torch's own headers and ABI; the stamp it writes is what the service's
software facts read (service/facts/software.py ggml_kernel_built)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from service.facts.software import GGML_KERNEL_BUILT, GGML_KERNEL_LIBRARY

SOURCES = [str(Path(__file__).with_name(name)) for name in ("ggml_linear.cpp", "bf16_linear.cpp")]


def build(tree: Path, ggml_build: Path, built_from: str) -> None:
    from torch.utils.cpp_extension import load

    libraries = (ggml_build / "bin").resolve()
    GGML_KERNEL_LIBRARY.parent.mkdir(parents=True, exist_ok=True)
    load(
        name=GGML_KERNEL_LIBRARY.stem,
        sources=SOURCES,
        extra_include_paths=[str((tree / "ggml" / "include").resolve())],
        # -fopenmp: at::parallel_for is OpenMP in torch's headers; without it the slices run one after the other.
        # The library then shares torch's libgomp (same soname, already loaded), so its threads are the engine's.
        extra_cflags=["-O3", "-march=native", "-fopenmp"],
        # rpath: the library finds ggml where it was built, in every vLLM process, without LD_LIBRARY_PATH
        extra_ldflags=[f"-L{libraries}", "-lggml", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{libraries}", "-fopenmp"],
        build_directory=str(GGML_KERNEL_LIBRARY.parent),
        is_python_module=False,
    )
    GGML_KERNEL_BUILT.write_text(json.dumps({"built_from": built_from, "library": str(GGML_KERNEL_LIBRARY)}))


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
