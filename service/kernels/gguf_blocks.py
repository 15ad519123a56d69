"""A GGUF file's quantized linear layers served from their own blocks: a vLLM quantization method ("service_gguf")
whose weights are the file's rows of ggml blocks, multiplied by ggml's kernel for their type (the op of
ggml_linear.py, the kernels llama.cpp runs on the same file). No float round trip: the converter copies the blocks
(service/gguf_convert.py) and this method hands them to ggml at load.

vLLM 0.32 has a GGUF method of its own, but its kernels are CUDA's. This one registers with vLLM's
`register_quantization_config` in every vLLM process (the service's vLLM plugin, when the policy kept the blocks:
service/policy/model_source.py). A block row is independent of the others, so vLLM's own loaders stack q/k/v and
gate/up rows into merged layers, and split a row-parallel layer's bytes by rank as they split its values. Only vLLM's
processes import this module; its classes live at module level because vLLM pickles the config to its engine core.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.parameter import ModelWeightParameter

from service.kernels.ggml_linear import apply as ggml_apply
from service.kernels.ggml_linear import available, load_library
from service.policy.model_source import BLOCKS_METHOD as METHOD

# A child of the plugin's logger, whose handler works in every vLLM process.
log = logging.getLogger("service.vllm_plugin.gguf_blocks")
# From this many rows on the op dequantizes chunks and runs torch's GEMM: the int4 kernel's crossover (Q4_0, Zen 4,
# docs/quantization.md "prefill"); Q8_0's measured 64.
DENSE_FROM_ROWS = {"Q8_0": 64}
DENSE_FROM_DEFAULT = 128


def block_shape(type_name: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a ggml type, by gguf-py's table."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return int(size[0]), int(size[1])


class GgufBlocksLinearMethod(LinearMethodBase):
    def __init__(self, type_name: str) -> None:
        from gguf import GGMLQuantizationType

        self.type_name = type_name
        self.ggml_type = int(GGMLQuantizationType[type_name])
        self.block_values, self.block_bytes = block_shape(type_name)

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        if input_size_per_partition % self.block_values:
            raise ValueError(
                f"{self.type_name} blocks hold {self.block_values} inputs; this partition has "
                f"{input_size_per_partition} (a tensor-parallel size that splits a block)"
            )
        row_bytes = input_size_per_partition // self.block_values * self.block_bytes
        weight = ModelWeightParameter(
            data=torch.empty(sum(output_partition_sizes), row_bytes, dtype=torch.uint8),
            input_dim=1,
            output_dim=0,
            weight_loader=extra_weight_attrs.pop("weight_loader"),
        )
        layer.register_parameter("weight", weight)
        layer.gguf_k = input_size_per_partition

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        load_library()
        blocks = layer.weight.data.contiguous()
        n = blocks.shape[0]
        parts = torch.get_num_threads()  # one slice per thread of this worker's pool
        layer.ggml_args = (torch.ops.service_ggml.load(blocks, self.ggml_type, layer.gguf_k, n, parts), n)
        # The blocks live in ggml's buffer now.
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return ggml_apply(layer, x, bias, DENSE_FROM_ROWS.get(self.type_name, DENSE_FROM_DEFAULT))


class GgufBlocksConfig(QuantizationConfig):
    def __init__(self, type_name: str) -> None:
        super().__init__()
        self.type_name = type_name

    def get_name(self) -> Any:
        return METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GgufBlocksConfig:
        log.info("[service] GGUF blocks: %s linear layers on ggml's kernel", config["ggml_type"])
        return cls(config["ggml_type"])

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        # Linear layers only: embeddings, the output head and norms are dequantized in the checkpoint.
        return GgufBlocksLinearMethod(self.type_name) if isinstance(layer, LinearBase) else None


def register() -> None:
    """Make "service_gguf" a quantization method of vLLM in this process, once."""
    from vllm.model_executor.layers.linear import register_weight_loader_v2_supported_method
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    if not available():
        raise ImportError("the service's ggml kernel is not built (make kernels)")
    if METHOD not in QUANTIZATION_METHODS:
        register_weight_loader_v2_supported_method(GgufBlocksLinearMethod)
        register_quantization_config(METHOD)(GgufBlocksConfig)
