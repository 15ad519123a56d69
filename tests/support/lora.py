"""LoRA adapters for the demo model, written as PEFT saves them: random weights, large enough to change its text."""

from __future__ import annotations

import json
from pathlib import Path


def make_adapter(directory: Path, seed: int, rank: int = 8, layers: int = 4, width: int = 256) -> Path:
    """An adapter of q_proj and v_proj for a `layers`-layer model `width` wide (the demo model's)."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for module in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, width, generator=generator) * 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(width, rank, generator=generator) * 0.5
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "demo-tiny-llama",
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory
