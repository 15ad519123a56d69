"""Loaded by every Python process started with this directory on PYTHONPATH and AVX2_EMULATION set to a cpuinfo
file (tests/support/avx2_emulation/__main__.py sets both): the process sees an AVX2-only CPU wherever it asks.

- Opening /proc/cpuinfo opens that file instead (this machine's, without the newer ISAs' flags): the service's
  facts, vLLM's Zen detection and archspec read it.
- torch's CPU checks say no AVX-512, AVX-512 BF16 or AMX (they ask CPUID, which no file stands in for). vLLM asks
  them to load its kernel build (`CpuPlatform.import_kernels`: _C_AVX2) and to pick kernels and attention paths.

The ISA limits of torch's own libraries (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS) come
from the environment. The service's kernels are looked for under the key of the flags it reads, so it finds the AVX2
build the emulation made, apart from this CPU's own."""

import os

if os.environ.get("AVX2_EMULATION"):
    import builtins
    import io

    _open = builtins.open
    _emulated = os.environ["AVX2_EMULATION"]

    def _open_emulated(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.fspath(file) == "/proc/cpuinfo":
            file = _emulated
        return _open(file, *args, **kwargs)

    builtins.open = io.open = _open_emulated

    try:
        import torch.cpu
    except ImportError:  # a Python without torch (the system's): nothing of it to restrict
        pass
    else:
        for check in (
            "_is_avx512_supported",
            "_is_avx512_bf16_supported",
            "_is_avx512_vnni_supported",
            "_is_amx_tile_supported",
            "_is_amx_fp16_supported",
        ):
            if hasattr(torch.cpu, check):
                setattr(torch.cpu, check, lambda: False)
