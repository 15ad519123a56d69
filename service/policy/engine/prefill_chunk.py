"""How many tokens one engine step takes (vLLM's max_num_batched_tokens): the chunk a long prompt is prefilled in, and
so how long the other streams wait between two of their tokens while it is (a step of prefill on one CPU core runs at
a few hundred tokens a second: 2048 tokens hold every other stream for seconds).

The rule: the smallest chunk measured on this backend whose prefill at agent depth costs at most PREFILL_COST_ALLOWED
against vLLM's default (its median, with an interval that reaches 1), else vLLM's default; a larger chunk only where
it is surely faster (its whole interval above 1).
"""

from __future__ import annotations

from service.measurements.store import Row, cite, row
from service.policy.plan.decision import PolicyResult, engine, record
from service.settings import Settings

NAME = "max_num_batched_tokens"
# vLLM 0.32's CPU default for its OpenAI server, per tensor-parallel rank (EngineArgs.get_batch_defaults)
VLLM_CPU_DEFAULT = 2048
# Per backend, the chunks the depth sweep served beside the default (make bench-peer's depth part with --depth-chunk,
# ours alone): prefill at 16k tokens of fresh prompt, as speed against the default's, on the 1.5 B bench model's Q4_0.
MEASURED: dict[str, tuple[str, ...]] = {
    "amx": tuple(f"depth/xeon-amx/1.5b-q4_0-gguf/16384/prefill-chunk-{n}" for n in (512, 8192)),
}
# What a smaller chunk may cost the prefill of a long prompt (its median speed against the default's)
PREFILL_COST_ALLOWED = 0.95


def plan_prefill_chunk(
    backend: str, settings: Settings, user: frozenset[str], chunked_prefill: bool, max_model_len: int, ranks: int
) -> PolicyResult:
    default = VLLM_CPU_DEFAULT * ranks
    value, seqs = settings.max_num_batched_tokens, settings.max_num_seqs or 0
    if NAME in user and value is not None:
        if value < seqs:
            return PolicyResult(
                errors=(
                    f"{NAME}={value} is below max_num_seqs={seqs}: a step takes one token of every running sequence "
                    "at least (vLLM refuses it)",
                )
            )
        if not chunked_prefill and value < max_model_len:
            return PolicyResult(
                errors=(
                    f"{NAME}={value} is below max_model_len={max_model_len} with chunked prefill off: a prompt is "
                    "prefilled in one step, so longer ones could never start; raise it or turn chunked prefill on",
                )
            )
        return PolicyResult.of(engine(NAME, value, "set by the user", "user"))
    if not chunked_prefill:
        # vLLM takes a prompt whole then; a step must hold the longest one
        why = "chunked prefill off: a prompt is taken in one step (vLLM's max of max_model_len and its default)"
        return PolicyResult.of(record("engine", NAME, max(max_model_len, default), why, "default"))
    rows = [row(key) for key in MEASURED.get(backend, ())]
    if not rows:
        why = f"vLLM's CPU default ({VLLM_CPU_DEFAULT} a tensor-parallel rank): no other chunk measured on {backend}"
        return PolicyResult.of(record("engine", NAME, default, why, "default"))
    chosen = chosen_chunk(rows)
    if chosen is None:
        why = (
            f"vLLM's CPU default ({VLLM_CPU_DEFAULT} a tensor-parallel rank): no smaller chunk measured on {backend} "
            "prefills as fast, no larger one surely faster (prefill of a 16k-token prompt, as speed against the "
            "default's): " + "; ".join(f"{r.params['chunk']} tokens a step {cite(r.key)}" for r in rows)
        )
        return PolicyResult.of(record("engine", NAME, default, why, "default"))
    size = max(int(chosen.params["chunk"]) * ranks, seqs)  # a step holds a token of every running sequence
    if size < default:
        why = (
            f"a chunk of {size} tokens holds the other streams' next tokens for a shorter step than vLLM's default "
            f"{default}, and prefills a long prompt about as fast: {cite(chosen.key)}"
        )
    else:
        why = f"a chunk of {size} tokens prefills a long prompt surely faster than vLLM's default {default}: {cite(chosen.key)}"
    return PolicyResult.of(engine(NAME, size, why, "policy"))


def chosen_chunk(rows: list[Row]) -> Row | None:
    """The smallest chunk below the default that costs prefill at most PREFILL_COST_ALLOWED and is not surely slower,
    else the smallest above it that is surely faster."""
    smaller = [
        r
        for r in rows
        if int(r.params["chunk"]) < VLLM_CPU_DEFAULT and float(r.value or 0) >= PREFILL_COST_ALLOWED and _high(r) >= 1
    ]
    if smaller:
        return min(smaller, key=lambda r: int(r.params["chunk"]))
    larger = [r for r in rows if int(r.params["chunk"]) > VLLM_CPU_DEFAULT and _low(r) > 1]
    return min(larger, key=lambda r: int(r.params["chunk"])) if larger else None


def _high(r: Row) -> float:
    return r.interval[1] if r.interval else float(r.value or 0)


def _low(r: Row) -> float:
    return r.interval[0] if r.interval else float(r.value or 0)
