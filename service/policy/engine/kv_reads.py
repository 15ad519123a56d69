"""The KV-cache bytes one decode step reads at a given depth of context, beside the weights' (model.read_per_token):
at agent depth (Claude Code's prompt is about 12k tokens once its tools are rendered) a step reads the whole cache of
every full-attention layer, which for the shapes users run (8 KV heads of 128 over 28-32 layers) outweighs 4-bit
weights. And how many sessions of each depth the cache holds at once."""

from __future__ import annotations

from service.facts.model import ModelFacts
from service.policy.plan.decision import Decision, record

DEPTHS = (4096, 16384, 32768)  # llama-bench's -d sweep of agent depths


def depths_for(max_len: int) -> tuple[int, ...]:
    """The depths a context of `max_len` tokens reaches (its own length where it reaches none of DEPTHS)."""
    return tuple(d for d in DEPTHS if d <= max_len) or (max_len,)


def kv_read_per_token(model: ModelFacts, value_bytes: int, max_len: int) -> tuple[Decision, ...]:
    """model.kv_read_per_token: {depth: bytes a decode step reads of the KV cache}, where the model keeps one."""
    if not model.kv_bytes_per_token(value_bytes):
        return ()
    reads = {depth: model.kv_read_at(depth, value_bytes) for depth in depths_for(max_len)}
    shown = ", ".join(f"{reads[d] / 1e6:.1f} MB at {_k(d)} tokens" for d in reads)
    layers = f"{model.full_attention_layers} attention layers x {model.num_kv_heads} KV heads of {model.head_dim}"
    if model.uses_mla:
        layers = f"{model.full_attention_layers} MLA layers"
    window = (
        f"; {model.sliding_layers} of them see only a {model.sliding_window}-token window"
        if model.sliding_layers
        else ""
    )
    why = (
        f"one decode step reads {shown} of KV cache ({layers}{window}, {value_bytes} bytes a cached value), "
        "beside the weights it reads (model.read_per_token)"
    )
    return (record("model", "kv_read_per_token", reads, why, "policy"),)


def sessions_at_depth(kv_tokens: int, max_len: int, max_seqs: int) -> str:
    """How many sessions of each depth a cache of `kv_tokens` holds at once (at most max_seqs run)."""
    held = [f"{min(kv_tokens // depth, max_seqs)} of {_k(depth)}" for depth in depths_for(max_len)]
    return "sessions held at once: " + ", ".join(held)


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
