"""Tiny random-weight models built offline with the demo model's recipe (tokenizer + config)."""
from __future__ import annotations

from pathlib import Path

from service.demo_model import build_model


def _qwen3_next_weights(directory: Path) -> None:
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    config = Qwen3NextConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        torch_dtype="bfloat16",
    )
    Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)


def tiny_qwen3_next(cache_dir: Path) -> Path:
    """A hybrid Gated-DeltaNet model (linear_attention / full_attention layers), about 10 MB."""
    return build_model(cache_dir / "models" / "tiny-qwen3-next-v2", build_weights=_qwen3_next_weights)


def _qwen3_next_unequal_gdn_weights(directory: Path) -> None:
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    _qwen3_next_weights(directory)  # the recipe above, then value heads twice as wide as the key heads
    config = Qwen3NextConfig.from_pretrained(directory)
    config.linear_value_head_dim = 128
    torch.manual_seed(0)
    Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)


def tiny_qwen3_next_unequal_gdn_heads(cache_dir: Path) -> Path:
    """The hybrid model with linear_key_head_dim 64 != linear_value_head_dim 128: transformers runs it, vLLM 0.32's
    CPU GDN prefill kernel does not (a kernel limit the pre-flight check refuses)."""
    return build_model(
        cache_dir / "models" / "tiny-qwen3-next-gdn-k64-v128", build_weights=_qwen3_next_unequal_gdn_weights
    )
