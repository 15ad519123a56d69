"""What the live CPU should get, derived from torch's and vLLM's own checks, never from the service's reading:
a test that asks these expects the right thing on whichever machine it lands on."""

from __future__ import annotations

from service.policy.machine.backends import GENERIC_PLATFORM, ZEN_PLATFORM


def vllm_runs_zen() -> bool:
    """vLLM's own test (`vllm.platforms.cpu_platform_plugin`): an AMD CPU with AVX-512 where zentorch imports."""
    from vllm.platforms import _is_amd_zen_cpu

    if not _is_amd_zen_cpu():
        return False
    try:
        import zentorch  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def expected_platform() -> str:
    return ZEN_PLATFORM if vllm_runs_zen() else GENERIC_PLATFORM


def expected_backend() -> str:
    import torch

    if vllm_runs_zen():
        return "zen"
    if torch.cpu._is_amx_tile_supported():
        return "amx"
    return "avx512" if torch.cpu._is_avx512_supported() else "avx2"


def native_bf16() -> bool:
    """torch's own test of AVX-512 BF16 (every CPU with AMX bf16 met so far has it too)."""
    import torch

    return torch.cpu._is_avx512_bf16_supported()
