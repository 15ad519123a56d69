"""An int4 weight-only linear kernel the service hands to vLLM: Intel's auto-round-lib (ARK: BesTLA's JIT kernels for
AVX2, AVX-512 and AMX, prebuilt in the `auto-round-lib` wheel), called through the custom op vLLM itself defines for
it (`torch.ops.vllm.inc_ark_woq_linear`, with a fake implementation, so torch.compile traces through it).

vLLM 0.32's only x86 int4 kernel (CPUWNA16LinearKernel, op cpu_gemm_wna16) is missing from its AVX2 kernel build;
this one runs on every x86 CPU, so int4 checkpoints (compressed-tensors W4A16, GPTQ, AWQ) are served on AVX2 hosts.
The service's vLLM plugin registers it in each vLLM process (vLLM's `register_linear_kernel`) when the policy decided
it (service/policy/linear/quant.py), and the policy disables the vLLM kernels it stands in for (VLLM_DISABLED_KERNELS), since
vLLM tries registered kernels after its own.

Weights go from the checkpoint's int4 packing into ARK's blob once, at load, without a float round trip; each
tensor-parallel rank repacks its own partition. ARK computes in fp32 (its wrapper converts 16-bit activations).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING

from service.kernels.int4_layer import groups_first, int4_kernel_base, to_input_packed
from service.kernels.registry import KERNELS, ark_shape_fits

if TYPE_CHECKING:
    import torch

KERNEL_NAME = KERNELS["auto-round"].vllm_class


def available() -> bool:
    return importlib.util.find_spec("auto_round_kernel") is not None


@functools.cache
def kernel_class() -> type:
    """The MPLinearKernel subclass, built on demand (once): importing vLLM is for vLLM's processes only."""
    import torch
    from vllm.model_executor.layers.quantization.inc.schemes.inc_ark_ops import ark_ops
    from vllm.model_executor.layers.quantization.utils import replace_parameter

    class ArkWNA16LinearKernel(int4_kernel_base()):  # type: ignore[misc]
        @classmethod
        def fits(cls, k: int, n: int, group: int) -> tuple[bool, str | None]:
            fits, why = ark_shape_fits(k, n, group)
            if not fits:
                return False, why
            if not available():
                return False, "auto-round-lib is not installed"
            return True, None

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            from auto_round_kernel.qlinear import QuantLinear

            ark_ops.register_ops_once()
            k, n = self.config.partition_weight_shape
            group = k if self.config.group_size == -1 else self.config.group_size
            asym = self.config.zero_points
            scales = getattr(layer, self.w_s_name)
            ark = QuantLinear(4, group, not asym, k, n, bias=False, weight_dtype=scales.dtype)
            with torch.no_grad():
                ark.qweight.copy_(to_input_packed(getattr(layer, self.w_q_name)))
                ark.scales.copy_(groups_first(scales))
                if asym:
                    ark.qzeros.copy_(groups_first(getattr(layer, self.w_zp_name)))
            ark.post_init()  # the int4 values and their scales into ARK's blob, once
            replace_parameter(layer, self.w_q_name, torch.nn.Parameter(ark.qweight.detach(), requires_grad=False))
            for name in (self.w_s_name, self.w_zp_name):
                if name and getattr(layer, name, None) is not None:
                    setattr(layer, name, None)  # inside the blob now
            layer.ark_args = (n, k, group, ark.cdt, ark.wdt, ark.sdt, asym)

        def apply_weights(
            self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
        ) -> torch.Tensor:
            n, k, group, compute, weight, scale, asym = layer.ark_args
            blob = getattr(layer, self.w_q_name)
            return torch.ops.vllm.inc_ark_woq_linear.default(x, blob, bias, n, k, group, compute, weight, scale, asym)

    ArkWNA16LinearKernel.__name__ = ArkWNA16LinearKernel.__qualname__ = KERNEL_NAME
    return ArkWNA16LinearKernel


def register() -> None:
    """Add the kernel to vLLM's CPU candidates in this process (vLLM's own registration API)."""
    from vllm.model_executor.kernels.linear import _POSSIBLE_KERNELS, register_linear_kernel
    from vllm.platforms import PlatformEnum

    if kernel_class() not in _POSSIBLE_KERNELS.get(PlatformEnum.CPU, []):  # once per process
        register_linear_kernel(kernel_class(), PlatformEnum.CPU)
