"""Runs a command (pytest by default) on this machine as if its CPU had AVX2 and nothing newer: the code paths of an
AVX2-only host (Zen 1-3, Xeons before Skylake-SP) on an AVX-512 one, where no AVX2-only machine is at hand.

  python -m tests.support.avx2_emulation [--] [pytest arguments | -m module arguments]

What it sets up:
- this machine's /proc/cpuinfo without its AVX-512, AVX-VNNI and AMX flags (.cache/avx2-emulation/cpuinfo), which
  every Python process the command starts (vLLM's included) opens instead of /proc/cpuinfo (sitecustomize.py beside
  this file);
- torch's CPU checks answer no AVX-512 or AMX there too: vLLM loads its AVX2 kernel build (_C_AVX2) and picks its
  kernels as on an AVX2 host;
- torch, oneDNN and MKL restricted to AVX2 (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS);
- the service's kernels built for AVX2 alone (haswell), under the emulated flags' key beside this CPU's own build.
It checks that vLLM then lacks its AVX-512 int4 op and that the service picks the avx2 backend before it runs the
command. Speeds measured this way are this machine's memory and cores running AVX2 code, not an AVX2 host's.
On a CPU without AVX-512 it runs the command as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from service.facts.software import GGML_KERNEL_DIR, cpu_flags_key
from service.kernels import ggml_build
from service.kernels.ggml_build import SOURCES

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
CACHE = REPO / ".cache" / "avx2-emulation"
# The llama.cpp source of `make kernels` (make test-avx2-emulated passes it).
LLAMA_CPP = Path(
    os.environ.get("AVX2_EMULATION_LLAMA_CPP", REPO / ".cache/bench-src/llama_cpp_python-0.3.36/vendor/llama.cpp")
)
HIDDEN = ("avx512", "avx_vnni", "amx")
BUILT_FROM = "ggml for AVX2 alone (the AVX2 emulation)"
RESTRICTED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def avx2_cpuinfo(text: str) -> str:
    """`text` (a /proc/cpuinfo) with the flags of every ISA newer than AVX2 taken out of each processor's flags."""
    lines = []
    for line in text.splitlines():
        if line.startswith("flags"):
            key, flags = line.split(":", 1)
            line = f"{key}: " + " ".join(f for f in flags.split() if not f.startswith(HIDDEN))
        lines.append(line)
    return "\n".join(lines) + "\n"


def emulation_env(cpuinfo: Path) -> dict[str, str]:
    path = [str(HERE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **os.environ,
        **RESTRICTED,
        "AVX2_EMULATION": str(cpuinfo),
        "PYTHONPATH": os.pathsep.join(path),
    }


def _stale(stamp: Path) -> bool:
    """The AVX2 build is missing, another build, or older than what it is built from (as `make kernels` sees it)."""
    sources = [*SOURCES, ggml_build.__file__, LLAMA_CPP / "CMakeLists.txt"]
    if not stamp.is_file() or json.loads(stamp.read_text()).get("built_from") != BUILT_FROM:
        return True
    return any(Path(s).stat().st_mtime > stamp.stat().st_mtime for s in sources)


def _check(env: dict[str, str]) -> None:
    """The emulation is in force in a fresh process: vLLM's loaded build lacks its AVX-512 int4 op, the service
    chooses avx2 and finds the AVX2 build of its kernels."""
    probe = (
        "import torch; from vllm.platforms.cpu import CpuPlatform; CpuPlatform.import_kernels(); "
        "print(hasattr(torch.ops._C, 'cpu_gemm_wna16'))"
    )
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.split()[-1] == "False", f"vLLM still loads an AVX-512 kernel build:\n{run.stderr}"
    detect = subprocess.run(
        [sys.executable, "-m", "service", "detect", "--json"], env=env, capture_output=True, text=True, check=True
    )
    report = json.loads(detect.stdout)
    assert report["backend"]["name"] == "avx2", f"the service chose {report['backend']['name']} in the emulation"
    kernels = report["software"]["ggml_kernel"]
    assert kernels == BUILT_FROM, f"the service finds the kernels {kernels!r}, not the AVX2 build"


def main(argv: list[str]) -> int:
    argv = argv[1:] if argv[:1] == ["--"] else argv
    command = [sys.executable, *(argv if argv[:1] == ["-m"] else ["-m", "pytest", *argv])]
    host = Path("/proc/cpuinfo").read_text()
    if "avx512f" not in host.split():
        print("avx2-emulation: this CPU has no AVX-512 already; running the command as it is", file=sys.stderr)
        return subprocess.call(command, cwd=REPO)
    CACHE.mkdir(parents=True, exist_ok=True)
    cpuinfo = CACHE / "cpuinfo"
    cpuinfo.write_text(avx2_cpuinfo(host))
    env = emulation_env(cpuinfo)
    # The service looks for its kernels under the key of the flags it reads: the emulated ones get their own build.
    if _stale(GGML_KERNEL_DIR.parent / cpu_flags_key(cpuinfo) / "kernel" / "built.json"):
        build = [
            sys.executable,
            "-m",
            "service.kernels.ggml_build",
            str(LLAMA_CPP),
            BUILT_FROM,
            "avx2",
        ]
        subprocess.run(build, env=env, cwd=REPO, check=True)
    _check(env)
    print("avx2-emulation: vLLM's _C_AVX2, the avx2 backend, the service's kernels built for AVX2", file=sys.stderr)
    return subprocess.call(command, env=env, cwd=REPO)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
