"""Model directory (or Hugging Face id in the local cache) -> architecture facts, without loading weights."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelFacts:
    path: str  # resolved local directory
    architecture: str  # first of config.architectures, e.g. "LlamaForCausalLM"
    model_type: str
    is_embedding: bool  # pooling/sentence-embedding model (BERT-like, or sentence-transformers layout)
    has_linear_attention: bool  # Gated DeltaNet / linear-attention layers present
    linear_attention_layers: int
    full_attention_layers: int
    uses_mla: bool  # multi-head latent attention (DeepSeek V2/V3, Kimi K2 ...)
    quantization: str | None  # e.g. "gptq-w4a16", "compressed-tensors-w8a8", "awq-w4a16", "fp8", None
    declared_dtype: str | None  # torch_dtype / dtype from config, e.g. "bfloat16"
    max_context: int | None  # max_position_embeddings (or equivalent)
    weight_bytes: int  # sum of safetensors (or .bin) file sizes on disk; 0 if unknown
    num_layers: int
    num_kv_heads: int | None
    head_dim: int | None
    kv_lora_rank: int | None  # MLA
    qk_rope_head_dim: int | None  # MLA

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token occupies across all attention layers (linear-attention layers keep a
        fixed-size state instead, so they do not count)."""
        if self.uses_mla and self.kv_lora_rank:
            return self.full_attention_layers * (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) * dtype_bytes
        if not self.num_kv_heads or not self.head_dim:
            return 0
        return 2 * self.full_attention_layers * self.num_kv_heads * self.head_dim * dtype_bytes


class ModelNotFound(ValueError):
    pass


def resolve_model_path(model: str, hf_cache: Path | None = None) -> Path:
    """A local directory as is; an `org/name` id resolved to its snapshot in the local HF cache."""
    raise NotImplementedError


def inspect_model(model: str, hf_cache: Path | None = None) -> ModelFacts:
    raise NotImplementedError
