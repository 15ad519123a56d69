"""What an architecture's GGUF file needs in the converted config beyond transformers' mapping: the settings
llama.cpp reads from the file's metadata, or derives from it, that the mapping leaves at transformers' defaults.
Each mend names the llama.cpp code it follows (src/models/<architecture>.cpp, llama.cpp as llama-cpp-python 0.3.36
vendors it); tests/integration/test_gguf_llama_cpp.py checks the result against llama.cpp."""

from __future__ import annotations

from typing import Any

from service.facts.gguf import GgufFacts


def _gemma2(keys: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """gemma2.cpp: soft-capping from the metadata (llama.cpp's defaults 50 and 30 where absent), and queries scaled
    by 1/sqrt(head_dim), or by 1/sqrt(hidden / heads) for the 46-layer 27B; transformers' default scalar is 256."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    big = int(config["num_hidden_layers"]) == 46
    return {
        "attn_logit_softcapping": float(keys.get("attn_logit_softcapping", 50.0)),
        "final_logit_softcapping": float(keys.get("final_logit_softcapping", 30.0)),
        "query_pre_attn_scalar": int(config["hidden_size"]) // heads if big else head_dim,
    }


MENDS = {"gemma2": _gemma2}


def config_mends(gguf: GgufFacts) -> tuple[dict[str, Any], str | None]:
    """(config entries to add, why) for the file's architecture."""
    mend = MENDS.get(gguf.architecture)
    if mend is None:
        return {}, None
    entries = mend(dict(gguf.architecture_keys), dict(gguf.config))
    why = (
        f"llama.cpp's {gguf.architecture} settings that transformers' GGUF mapping leaves at its defaults: "
        + ", ".join(f"{k}={v}" for k, v in entries.items())
        + f" (service/policy/gguf_config.py, after llama.cpp's src/models/{gguf.architecture}.cpp)"
    )
    return entries, why
