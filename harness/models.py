"""The bandwidth-bound model for the decode measurement: Llama architecture, random weights, ~1 GB in bf16,
built locally at bench time (never committed) with the demo model's tokenizer. SIZES: the same at the decoder shapes
of the checkpoints users run (the size sweep, `make bench-peer BENCH_ARGS="--peer-size 1.5b"`), with the demo
tokenizer's small vocabulary: the decoder's cost, without the 128-152 k-row embedding and head of the real ones."""

from __future__ import annotations

import json
from pathlib import Path

from service.models.demo_model import TOKENIZER_CONFIG, build_model

NAME = "bench-llama-0.5b"
VERSION = "v1"  # bump when the recipe changes, so caches rebuild

# 11 layers x (attention 2048x2048 q/o + GQA k/v 2048x512 + SwiGLU 3 x 2048x5632) + head: ~0.5 B parameters,
# about 1.0 GB of bf16 weights read per decoded token (2.0 GB as fp32): well past the last-level cache.
CONFIG = dict(
    TOKENIZER_CONFIG,
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=11,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
)


# size -> the decoder's shape and context: Qwen2.5-1.5B's and Llama-3.2-3B's (their config.json), as Llama layers
# without biases. Their contexts are the checkpoints' own, for the depth sweep (bench/parts/depth.py).
_SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)
DEFAULT_SIZE = "0.5b"  # CONFIG: the bench model every other part runs
SIZES: dict[str, dict] = {
    DEFAULT_SIZE: CONFIG,
    "1.5b": {**CONFIG, **dict(zip(_SHAPE_KEYS, (1536, 8960, 28, 12, 2, 32768), strict=True))},
    "3b": {**CONFIG, **dict(zip(_SHAPE_KEYS, (3072, 8192, 28, 24, 8, 131072), strict=True))},
}
# bump a size's version when its recipe changes, so caches rebuild (v2: the sized models got their own contexts)
SIZE_VERSIONS = {DEFAULT_SIZE: VERSION, "1.5b": "v2", "3b": "v2"}


def parameter_shapes(cfg: dict = CONFIG) -> dict[str, tuple[int, ...]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def parameters(cfg: dict = CONFIG) -> int:
    return sum(_numel(s) for s in parameter_shapes(cfg).values())


def bytes_per_token(dtype_bytes: int, cfg: dict = CONFIG) -> int:
    """Weight bytes one decode step reads: every parameter but the input embedding table, of which a
    step gathers a single row. (KV-cache reads at these context lengths add well under 1%.)"""
    shapes = parameter_shapes(cfg)
    return sum(_numel(s) for k, s in shapes.items() if k != "model.embed_tokens.weight") * dtype_bytes


def _write_weights(directory: Path, cfg: dict = CONFIG) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in parameter_shapes(cfg).items():
        if len(shape) == 1:
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def ensure_bench_model(cache_dir: Path, size: str = DEFAULT_SIZE) -> Path:
    cfg = SIZES[size]
    name = NAME if size == DEFAULT_SIZE else f"bench-llama-{size}"
    return build_model(
        cache_dir / "models" / f"{name}-{SIZE_VERSIONS[size]}", build_weights=lambda d: _write_weights(d, cfg)
    )
