"""The KV cache's element type (the kv_cache_dtype setting) -> vLLM's kv_cache_dtype and the bytes one cached value
takes (which the memory plan turns into tokens), with what fp8 costs on the attention kernel that will run it.

vLLM 0.32's CPU attention (v1/attention/backends/cpu_attn.py) stores fp8 (e4m3 or e5m2, scales 1.0) only on x86
with AVX-512 or AMX tiles, and for head sizes divisible by 32; its CPU MLA backend stores the model dtype only.
Those are refused here, naming why, instead of vLLM's NotImplementedError in the worker after the weights load.
"""

from __future__ import annotations

from service.facts.cpu import Isa
from service.facts.model import ModelFacts
from service.measurements.store import cite
from service.policy.engine.dtype import BYTES
from service.policy.plan.decision import PolicyResult, Source, engine

# vLLM's names; "fp8" is e4m3 there.
FP8 = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# vLLM's CPU attention stores fp8 in blocks of 32 values of a head.
FP8_HEAD_MULTIPLE = 32
# What fp8 cost in perplexity, per CPU attention kernel: SmolLM2-135M-Instruct on 2 047 tokens of the Apache-2.0
# text, prefilled in 256-token chunks so that attention reads the cache (the rows cited here). The AMX kernel runs
# bf16 models; the vec kernel the rest.
MEASURED_COST = {kernel: cite(f"claim/kv-fp8-cost/{kernel}") for kernel in ("amx", "vec")}
# What fp8 buys at agent depth, per kernel: decode at 16k tokens of context against the cache in the model dtype, the
# same service side by side (make bench-peer's depth sweep with --depth-kv fp8, on the 1.5 B bench model's Q4_0 file).
MEASURED_AT_DEPTH = {"amx": cite("depth/xeon-amx/1.5b-q4_0-gguf/16384/decode-kv-fp8")}
# Where no fp8 is stored (AVX2 CPUs, whose engines run fp32), the one smaller cache is the model's own dtype: bf16
# served beside fp32 at 8k tokens (make bench-peer's depth sweep with --depth-dtype bfloat16, SmolLM2's Q4_1 file).
BF16_AT_DEPTH = tuple(cite(f"depth/zen1/smollm2-q4_1/8000/{m}-dtype-bfloat16") for m in ("decode", "prefill"))


def plan_kv_cache_dtype(
    isa: Isa, model: ModelFacts, setting: str, dtype: str, source: Source
) -> tuple[PolicyResult, int]:
    """(the decision, bytes per cached value)."""
    if setting not in FP8:
        return PolicyResult.of(engine("kv_cache_dtype", "auto", _auto_reason(isa, model, dtype), source)), BYTES[dtype]
    stored = FP8[setting]
    refusal = _refusal(isa, model)
    if refusal:
        return PolicyResult(errors=(f"kv_cache_dtype={setting}: {refusal}",)), BYTES[dtype]
    kernel = _kernel(isa, dtype)
    cost = MEASURED_COST[kernel] if stored == "fp8_e4m3" or kernel == "amx" else "quality cost not measured here"
    why = (
        f"{stored}: 1 byte a cached value, {BYTES[dtype]}x the tokens of {dtype} in the same memory; "
        f"{cost}; vLLM's {kernel} attention kernel, scales 1.0"
    )
    return PolicyResult.of(engine("kv_cache_dtype", stored, why, source)), 1


def _kernel(isa: Isa, dtype: str) -> str:
    return "amx" if isa.amx and dtype == "bfloat16" else "vec"


def _auto_reason(isa: Isa, model: ModelFacts, dtype: str) -> str:
    """Why the cache holds the model dtype: what a value takes against llama.cpp's default f16 cache (at agent depth
    a decode step reads the whole cache, model.kv_read_per_token), and what the smaller type this CPU could store
    would cost, or why there is none."""
    why = f"the model dtype ({dtype}, {BYTES[dtype]} bytes a value): values cached as computed, no quality cost"
    if BYTES[dtype] > 2:
        why += "; twice the bytes of llama.cpp's default f16 cache that a decode step reads at depth"
    refusal = _refusal(isa, model)
    if refusal and dtype == "float32":
        decode, prefill = BF16_AT_DEPTH
        return (
            f"{why}; no smaller type here: {refusal}; bf16 as the model dtype (dtype=bfloat16) would cache 2 bytes a "
            f"value, but its decode at depth against this cache, {decode}, does not make up for its prefill, {prefill}"
        )
    if refusal:
        return f"{why}; no smaller type here: {refusal}"
    kernel = _kernel(isa, dtype)
    speed = MEASURED_AT_DEPTH.get(kernel, "not measured on this kernel")
    return (
        f"{why}; fp8 (kv_cache_dtype=fp8, 1 byte a value) is left to the user: its decode at 16k tokens against this "
        f"cache: {speed}; its quality cost: {MEASURED_COST[kernel]}"
    )


def _refusal(isa: Isa, model: ModelFacts) -> str | None:
    if not (isa.avx512 or isa.amx_tile):
        return (
            "vLLM's CPU attention stores an fp8 KV cache only on x86 CPUs with AVX-512 or AMX, and this one has neither"
        )
    if model.uses_mla:
        return "vLLM's CPU MLA attention stores the KV cache in the model dtype only"
    if model.head_dim and model.head_dim % FP8_HEAD_MULTIPLE:
        return (
            f"vLLM's CPU attention stores fp8 only for head sizes divisible by {FP8_HEAD_MULTIPLE}, "
            f"and this model's is {model.head_dim}"
        )
    return None
