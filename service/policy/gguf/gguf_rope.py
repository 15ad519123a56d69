"""What a GGUF file's rotary embedding needs beyond transformers' mapping, which drops the tensors llama.cpp keeps
its rope scaling in. Without them the converted model rotates by the base frequencies and answers wrongly: a tiny
Llama with Llama 3.1's scaling agreed with llama.cpp on 8 of 72 greedy tokens (tests/integration/test_gguf_llama_cpp.py).

- rope_freqs.weight (Llama 3.1/3.2's "llama3" scaling, stored as its computed per-dimension divisors): carried into
  the config as LongRoPE factors with a single range (short and long factors the same, the original context the
  whole context), which divides each dimension's frequency by its factor exactly as llama.cpp does, with no
  attention scaling; transformers and vLLM implement LongRoPE for every architecture.
- rope_factors_long/short (Phi-3's LongRoPE, whose factor choice depends on the context): not carried; refused."""

from __future__ import annotations

from typing import Any

from service.facts.gguf import GgufFacts


def rope_config(gguf: GgufFacts) -> tuple[dict[str, Any], str | None, str | None]:
    """(config entries to add, why (for the report), error) for the file's rope scaling tensors."""
    if gguf.longrope_tensors:
        return (
            {},
            None,
            f"GGUF file {gguf.path}: its LongRoPE factors ({', '.join(gguf.longrope_tensors)}) are lost by "
            "transformers' mapping, and the model would answer wrongly without them; not served",
        )
    if gguf.rope_freqs is None:
        return {}, None, None
    context = int(gguf.config.get("max_position_embeddings") or 0)
    factors = list(gguf.rope_freqs)
    scaling = {
        "rope_type": "longrope",
        "short_factor": factors,
        "long_factor": factors,
        "original_max_position_embeddings": context,
    }
    why = (
        f"the file's rope_freqs ({len(factors)} per-dimension divisors, {min(factors):g}-{max(factors):g}: llama.cpp's "
        "form of Llama 3.1's rope scaling), which transformers' mapping drops, carried as LongRoPE factors over the "
        f"whole {context}-token context: each frequency divided as llama.cpp divides it"
    )
    return {"rope_scaling": scaling}, why, None
