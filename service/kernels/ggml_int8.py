"""An int8 linear kernel the service hands to vLLM for W8A8 checkpoints: ggml's Q8_0 matrix multiplication, the
kernel llama.cpp runs for Q8_0 files, through the same torch op as the int4 one (ggml_linear.py).

Per-channel (or per-tensor) int8 weights are Q8_0 blocks already: each block's 32 int8 values go in as stored, with
the channel's scale as the block's fp16 scale, so no float round trip. ggml quantizes the activations itself, per
32-block at run time, as llama.cpp does: a checkpoint's static activation scales (and zero points) go unused, and
the activations keep finer scales than per-token ones. The policy hands W8A8 to it where vLLM's int8 kernels are slow
(service/policy/machine/backends.py); the service's vLLM plugin registers it (vLLM's `register_linear_kernel`, kind "int8").
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from service.kernels.ggml_linear import (
    BLOCK,
    apply,
    available,
    dense_from,
    fp16_bytes,
    hand_to_vllm,
    handover,
    load_library,
)
from service.kernels.registry import KERNELS

if TYPE_CHECKING:
    import torch

KERNEL_NAME = KERNELS["ggml-q8_0"].vllm_class
Q8_0 = 8  # ggml_type (ggml.h)


def q8_0_blocks(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int8 weights [n, k] and per-channel scales [n] -> ggml Q8_0 rows, uint8 [n, k / 32 * 34]: per block, the fp16
    scale then the 32 int8 values."""
    import torch

    n, k = q.shape
    per_block = scales.reshape(n, 1).expand(n, k // BLOCK)
    values = q.contiguous().view(torch.uint8).reshape(n, k // BLOCK, BLOCK)
    return torch.cat([fp16_bytes(per_block), values], dim=-1).reshape(n, -1)


@functools.cache
def kernel_class() -> type:
    """The Int8ScaledMMLinearKernel subclass, built on demand (once): importing vLLM is for vLLM's processes only."""
    import torch
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import Int8ScaledMMLinearKernel
    from vllm.model_executor.layers.quantization.utils.w8a8_utils import convert_to_channelwise

    class GgmlInt8LinearKernel(Int8ScaledMMLinearKernel):
        @classmethod
        def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
            if not available():
                return False, "the service's ggml kernel is not built (make kernels)"
            return True, None

        @classmethod
        def can_implement(cls, c: object) -> tuple[bool, str | None]:
            return True, None  # any int8 scheme: ggml quantizes the activations itself

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            load_library()
            w_q, w_s, *inputs = self.layer_param_names
            weight, scale = getattr(layer, w_q), getattr(layer, w_s)
            n, k = weight.shape
            # Whole blocks only: the policy checks the model's shapes before it picks this kernel (ggml_blocks).
            if k % BLOCK:
                raise ValueError(f"{KERNEL_NAME}: input size {k} is not a multiple of ggml's {BLOCK}-wide blocks")
            with torch.no_grad():
                if not self.config.is_channelwise:
                    scale = convert_to_channelwise(scale.data, layer.logical_widths)
                blocks = q8_0_blocks(weight.data, scale.data.float())
            layer.ggml_args = (torch.ops.service_ggml.load(blocks, Q8_0, k, n, torch.get_num_threads()), n)
            layer.ggml_handover = handover("Q8_0")
            # The blocks live in ggml's buffer now; the checkpoint's tensors are dropped.
            for name in (w_q, w_s, *inputs):
                if getattr(layer, name, None) is not None:
                    setattr(layer, name, None)

        def apply_weights(
            self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
        ) -> torch.Tensor:
            return apply(layer, x, bias, dense_from(layer.ggml_handover, x.dtype))

    GgmlInt8LinearKernel.__name__ = GgmlInt8LinearKernel.__qualname__ = KERNEL_NAME
    return GgmlInt8LinearKernel


def register() -> None:
    hand_to_vllm(kernel_class(), "int8")
