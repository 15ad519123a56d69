"""A GGUF file's quantized linear layers served from their own blocks: a vLLM quantization method ("service_gguf")
whose weights are the file's rows of ggml blocks, multiplied by ggml's kernel for their type (the op of
ggml_linear.py, the kernels llama.cpp runs on the same file). No float round trip: the converter copies the blocks
(service/models/gguf_convert.py) and this method hands them to ggml at load.

vLLM 0.32 has a GGUF method of its own, but its kernels are CUDA's. This one registers with vLLM's
`register_quantization_config` in every vLLM process (the service's vLLM plugin, when the policy kept the blocks:
service/policy/gguf/model_source.py). A block row is independent of the others, so vLLM's own loaders stack q/k/v and
gate/up rows into merged layers, and split a row-parallel layer's bytes by rank as they split its values; a merged
layer whose parts differ in type keeps one handle per part. The token embedding and LM head keep their blocks too
where their type allows (service/policy/gguf/model_source.py kept_heads): a decode step's head is ggml's matmul on them.
Only vLLM's processes import this module; its classes live at module level because vLLM pickles the config to its
engine core.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.parameter import ModelWeightParameter
from vllm.model_executor.utils import set_weight_attrs

from service.kernels.ggml_linear import apply as ggml_apply
from service.kernels.ggml_linear import available, dense_from, handover, load_library
from service.kernels.registry import BLOCKS_METHOD as METHOD

# A child of the plugin's logger, whose handler works in every vLLM process.
log = logging.getLogger("service.in_vllm.plugin.gguf_blocks")


def block_shape(type_name: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a ggml type, by gguf-py's table."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return int(size[0]), int(size[1])


def empty_rows(type_name: str, rows: int, k: int) -> torch.Tensor:
    """uint8 [rows, row bytes] for rows of `k` values in `type_name` blocks, which must hold whole blocks."""
    values, nbytes = block_shape(type_name)
    if k % values:
        raise ValueError(
            f"{type_name} blocks hold {values} values; these rows have {k} (a tensor-parallel size that splits a block?)"
        )
    return torch.empty(rows, k // values * nbytes, dtype=torch.uint8)


class GgufBlocksLinearMethod(LinearMethodBase):
    """A linear layer whose rows are all of one type: one weight of [rows, row bytes], one ggml handle."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

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
        weight = ModelWeightParameter(
            data=empty_rows(self.type_name, sum(output_partition_sizes), input_size_per_partition),
            input_dim=1,
            output_dim=0,
            weight_loader=extra_weight_attrs.pop("weight_loader"),
        )
        layer.register_parameter("weight", weight)
        layer.gguf_k = input_size_per_partition

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        load_library()
        blocks = layer.weight.data.contiguous()
        layer.ggml_args = (_load(blocks, self.type_name, layer.gguf_k), blocks.shape[0])
        layer.ggml_handover = handover(self.type_name)
        # The blocks live in ggml's buffer now.
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return ggml_apply(layer, x, bias, dense_from(layer.ggml_handover, x.dtype))


class GgufMixedBlocksLinearMethod(LinearMethodBase):
    """A merged layer (q/k/v, gate/up) whose parts are of different types (K-quant mixes such as Q4_K_M keep v in
    Q6_K): each part's blocks in its own ggml handle, outputs side by side. One rank only (the policy keeps no mixed
    blocks under tensor parallelism)."""

    SHARDS = {"q": 0, "k": 1, "v": 2}  # vLLM's QKV shard ids; merged columns use 0, 1, ...

    def __init__(self, type_names: list[str]) -> None:
        self.type_names = type_names

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
        k = input_size_per_partition
        shapes = []
        for type_name, rows in zip(self.type_names, output_partition_sizes, strict=True):
            values, nbytes = block_shape(type_name)
            shapes.append((rows, k // values * nbytes))
        offsets = [0]
        for rows, row_bytes in shapes:
            offsets.append(offsets[-1] + rows * row_bytes)
        weight = torch.nn.Parameter(torch.empty(offsets[-1], dtype=torch.uint8), requires_grad=False)

        def load_part(param: torch.nn.Parameter, loaded: torch.Tensor, shard_id: str | int) -> None:
            part = self.SHARDS.get(shard_id, shard_id) if isinstance(shard_id, str) else shard_id
            if tuple(loaded.shape) != shapes[part]:
                raise ValueError(f"{self.type_names[part]} part {shard_id}: {list(loaded.shape)}, not {shapes[part]}")
            param.data[offsets[part] : offsets[part + 1]].copy_(loaded.reshape(-1))

        weight.weight_loader = load_part
        layer.register_parameter("weight", weight)
        layer.gguf_parts = (k, shapes, offsets)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        load_library()
        k, shapes, offsets = layer.gguf_parts
        flat = layer.weight.data
        layer.ggml_parts = [
            (_load(flat[start:end].view(rows, row_bytes), type_name, k), rows, handover(type_name))
            for type_name, (rows, row_bytes), start, end in zip(self.type_names, shapes, offsets, offsets[1:])
        ]
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = torch.cat(
            [
                torch.ops.service_ggml.linear(rows, handle, n, None, dense_from(part_handover, rows.dtype))
                for handle, n, part_handover in layer.ggml_parts
            ],
            dim=-1,
        )
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


class GgufBlocksEmbeddingMethod(QuantizeMethodBase):
    """A token embedding or LM head kept in its blocks: the head is ggml's matmul, the embedding dequantizes the rows
    it looks up. A head tied to the embedding shares its weight (vLLM's `tie_weights`), and so its ggml handle."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

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
        rows = empty_rows(self.type_name, sum(output_partition_sizes), input_size_per_partition)
        weight = torch.nn.Parameter(rows, requires_grad=False)
        # vLLM's vocab-parallel loader narrows the rows of this rank and zeroes its padding rows.
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0, **extra_weight_attrs})
        layer.register_parameter("weight", weight)
        layer.gguf_k, layer.gguf_dtype = input_size_per_partition, params_dtype

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weight = layer.weight
        if not hasattr(weight, "ggml_args"):  # the first of a tied embedding and head loads it
            load_library()
            blocks = weight.data.contiguous()
            weight.ggml_args = (_load(blocks, self.type_name, layer.gguf_k), blocks.shape[0])
            log.info("[service] GGUF blocks: %s %s on ggml's kernel", self.type_name, type(layer).__name__)
        layer.ggml_args = weight.ggml_args
        layer.ggml_handover = handover(self.type_name)
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return ggml_apply(layer, x, bias, dense_from(layer.ggml_handover, x.dtype))

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        handle, _ = layer.ggml_args
        rows = torch.ops.service_ggml.embedding(input_.reshape(-1), handle, layer.gguf_k)
        return rows.to(layer.gguf_dtype).reshape(*input_.shape, layer.gguf_k)


def _load(blocks: torch.Tensor, type_name: str, k: int) -> int:
    """ggml's handle for rows of blocks, in one slice per thread of this worker's pool."""
    from gguf import GGMLQuantizationType

    rows = blocks.contiguous()
    ggml_type = int(GGMLQuantizationType[type_name])
    return int(torch.ops.service_ggml.load(rows, ggml_type, k, rows.shape[0], torch.get_num_threads()))


class GgufBlocksConfig(QuantizationConfig):
    def __init__(self, types: dict[str, str]) -> None:
        super().__init__()
        self.types = types  # module name (the checkpoint's) -> ggml type of its blocks

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
        return cls(config["types"])

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        if isinstance(layer, VocabParallelEmbedding):
            # By role: vLLM's llama names its embedding "" (a head tied to it is in `types` as "lm_head" too).
            kept = self.types.get("lm_head" if isinstance(layer, ParallelLMHead) else "model.embed_tokens")
            return GgufBlocksEmbeddingMethod(kept) if kept else None
        # Norms, and a head or embedding the converter dequantized, are plain weights.
        if not isinstance(layer, LinearBase):
            return None
        parent, _, name = prefix.rpartition(".")
        parts = (
            [prefix] if prefix in self.types else [f"{parent}.{p}" for p in self.packed_modules_mapping.get(name, [])]
        )
        missing = [p for p in parts if p not in self.types]
        if len(missing) == len(parts):  # a layer no file stores in blocks (a MoE router's gate, in F32): dense
            return UnquantizedLinearMethod()
        if missing:  # part of one layer in blocks, part not: the conversion and vLLM's model disagree
            raise ValueError(f"{prefix}: the checkpoint keeps no GGUF blocks for {missing}")
        kinds = [self.types[p] for p in parts]
        return GgufBlocksLinearMethod(kinds[0]) if len(set(kinds)) == 1 else GgufMixedBlocksLinearMethod(kinds)


def register() -> None:
    """Make "service_gguf" a quantization method of vLLM in this process, once."""
    from vllm.model_executor.layers.linear import register_weight_loader_v2_supported_method
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    if not available():
        raise ImportError("the service's ggml kernel is not built (make kernels)")
    if METHOD not in QUANTIZATION_METHODS:
        register_weight_loader_v2_supported_method(GgufBlocksLinearMethod)  # the mixed one loads its own parts
        register_quantization_config(METHOD)(GgufBlocksConfig)
