"""What an architecture's GGUF file needs in the converted config beyond transformers' mapping: the settings
llama.cpp reads from the file's metadata, or derives from it, that the mapping leaves at transformers' defaults.
Each mend names the llama.cpp code it follows (src/models/<architecture>.cpp, llama.cpp as llama-cpp-python 0.3.36
vendors it); tests/integration/test_gguf_llama_cpp.py checks the result against llama.cpp."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.facts.gguf import GgufFacts


def _query_scalar(config: dict[str, Any], big_layers: int) -> int:
    """Gemma's queries are scaled by 1/sqrt(head_dim), or by 1/sqrt(hidden / heads) for the 27B (llama.cpp tells it
    by its layer count); transformers' default scalar is 256."""
    heads = int(config["num_attention_heads"])
    if int(config["num_hidden_layers"]) == big_layers:
        return int(config["hidden_size"]) // heads
    return int(config.get("head_dim") or config["hidden_size"] // heads)


def _gemma2(keys: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """gemma2.cpp: soft-capping from the metadata (llama.cpp's defaults 50 and 30 where absent); the 27B has 46
    layers."""
    return {
        "attn_logit_softcapping": float(keys.get("attn_logit_softcapping", 50.0)),
        "final_logit_softcapping": float(keys.get("final_logit_softcapping", 30.0)),
        "query_pre_attn_scalar": _query_scalar(config, 46),
    }


def _gemma3(keys: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """gemma3.cpp: sliding-window layers only where the file has a window, by the file's pattern (a list, or every
    n-th layer full, 6 where absent: llama_model_base::load_swa_pattern); the full layers' rope base and linear
    scaling (Gemma 3 4B-27B: 8), the sliding ones' own base (10000 where absent) and no scaling; final soft-capping
    only where the file has it; the 27B has 62 layers."""
    layers = int(config["num_hidden_layers"])
    pattern = keys.get("attention.sliding_window_pattern", 6)
    if not keys.get("attention.sliding_window"):
        sliding = [False] * layers
    elif isinstance(pattern, tuple):
        sliding = [bool(p) for p in pattern]
    else:
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": float(keys.get("rope.freq_base", 10000.0))}
    if keys.get("rope.scaling.type") == "linear" and keys.get("rope.scaling.factor"):
        full.update(rope_type="linear", factor=float(keys["rope.scaling.factor"]))
    local = {"rope_type": "default", "rope_theta": float(keys.get("rope.freq_base_swa", 10000.0))}
    return {
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_parameters": {"full_attention": full, "sliding_attention": local},
        "final_logit_softcapping": keys.get("final_logit_softcapping"),
        "query_pre_attn_scalar": _query_scalar(config, 62),
    }


def _qwen_moe(normalised: bool) -> Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]:
    """qwen2moe.cpp / qwen3moe.cpp: the experts' sizes and counts from the metadata, and whether the chosen experts'
    weights are renormalised (Qwen3-MoE's are, Qwen2-MoE's are not; transformers' default for both: not)."""

    def mend(keys: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        sizes = {
            "num_experts": "expert_count",
            "num_experts_per_tok": "expert_used_count",
            "moe_intermediate_size": "expert_feed_forward_length",
            "shared_expert_intermediate_size": "expert_shared_feed_forward_length",
        }
        return {name: int(keys[key]) for name, key in sizes.items() if key in keys} | {"norm_topk_prob": normalised}

    return mend


MENDS = {"gemma2": _gemma2, "gemma3": _gemma3, "qwen2moe": _qwen_moe(False), "qwen3moe": _qwen_moe(True)}


def config_mends(gguf: GgufFacts) -> tuple[dict[str, Any], str | None]:
    """(config entries to add, why) for the file's architecture."""
    mend = MENDS.get(gguf.architecture)
    if mend is None:
        return {}, None
    entries = mend(dict(gguf.architecture_keys), dict(gguf.config))
    why = (
        f"llama.cpp's {gguf.architecture} settings that transformers' GGUF mapping leaves at its defaults: "
        + ", ".join(f"{k}={v}" for k, v in entries.items())
        + f" (service/policy/gguf/gguf_config.py, after llama.cpp's src/models/{gguf.architecture}.cpp)"
    )
    return entries, why
