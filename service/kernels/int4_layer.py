"""What the service's int4 kernels (ark_wna16.py, ggml_linear.py) share: the int4 parameters of a vLLM layer as the
checkpoint stored them, and the MPLinearKernel base they extend."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def to_input_packed(param: torch.Tensor) -> torch.Tensor:
    """[in // 8, out] int32 words packed along the input dimension (GPTQ's layout; compressed-tensors stores the
    transpose)."""
    assert param.packed_dim == param.input_dim, "int4 weights packed along the output dimension"
    return param.data.t() if param.input_dim == 1 else param.data


def groups_first(param: torch.Tensor) -> torch.Tensor:
    """Scales or packed zero points as [groups, out] (compressed-tensors stores them output-first)."""
    return param.data.t() if param.output_dim == 0 else param.data


@functools.cache
def int4_kernel_base() -> type:
    """vLLM's MPLinearKernel for the CPU platform, taking 4-bit weights (with zero points where unsigned) only; a
    subclass adds its own checks in `fits`. Built on demand: importing vLLM is for vLLM's processes only."""
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearKernel
    from vllm.scalar_type import scalar_types

    class Int4Kernel(MPLinearKernel):
        @classmethod
        def get_min_capability(cls) -> int:
            return -1  # vLLM's CPU platform reports no capability

        @classmethod
        def can_implement(cls, c: Any) -> tuple[bool, str | None]:
            if c.weight_type not in (scalar_types.uint4b8, scalar_types.uint4):
                return False, f"{cls.__name__} is wired for 4-bit weights, not {c.weight_type}"
            if c.weight_type == scalar_types.uint4 and not c.zero_points:
                return False, "unsigned 4-bit weights without zero points"
            k, n = c.partition_weight_shape
            return cls.fits(k, n, k if c.group_size == -1 else c.group_size)

        @classmethod
        def fits(cls, k: int, n: int, group: int) -> tuple[bool, str | None]:
            raise NotImplementedError

    return Int4Kernel
