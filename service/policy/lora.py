"""LoRA adapters served beside the model: vLLM's LoRA engine arguments, sized from the adapters' own configs.

vLLM serves an adapter only when its rank fits `max_lora_rank` (one of a fixed list) and keeps `max_loras` of them in
one batch; the policy takes the smallest rank that fits them all and room for every adapter at once, so a request
for one never waits on another's. A slot holds max_lora_rank x (inputs + outputs) values per linear layer: small next
to the model.
"""

from __future__ import annotations

from service.facts.lora import AdapterFacts
from service.facts.model import ModelFacts
from service.policy.decision import PolicyResult, engine, env

# "1": every vLLM process leaves base-model tokens out of the LoRA ops (service/lora_rows.py), as the plugin reads it.
LORA_ROWS_ENV = "SERVICE_LORA_ROWS_FIX"

# vLLM 0.32's MaxLoRARanks (vllm/config/lora.py); tests/unit/test_lora.py checks them against it.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# Layers whose inputs are the vocabulary, not a width of the decoder's linear layers.
_VOCABULARY_LAYERS = frozenset({"embed_tokens", "lm_head", "wte", "word_embeddings", "tok_embeddings"})


def _misfit(adapter: AdapterFacts, model: ModelFacts) -> str | None:
    """An adapter made for another base model: a layer whose input width none of the model's linear layers takes, or
    more layers than the model has. vLLM finds it only once the engine is up, naming neither adapter nor layer
    ("The size of tensor a (256) must match the size of tensor b (2048)")."""
    widths = {k for k, _ in model.linear_shapes}
    where = f"lora_adapters: {adapter.name!r} does not fit the model (made for another base model?)"
    for module, inputs in adapter.inputs:
        if widths and module not in _VOCABULARY_LAYERS and inputs not in widths:
            takes = " or ".join(map(str, sorted(widths)))
            return f"{where}: its {module} takes {inputs} inputs; the model's linear layers take {takes}"
    if adapter.layers and model.num_layers and adapter.layers > model.num_layers:
        return f"{where}: it changes {adapter.layers} layers; the model has {model.num_layers}"
    return None


def _rank(adapters: tuple[AdapterFacts, ...]) -> int | None:
    """The smallest rank vLLM allows that holds the widest adapter; None: wider than any."""
    widest = max(a.rank for a in adapters)
    return next((r for r in LORA_RANKS if r >= widest), None)


def lora_slot_bytes(model: ModelFacts, dtype_bytes: int) -> int:
    """About what vLLM allocates at start for `max_loras` slots of `max_lora_rank` (vllm/lora/layers, in the model's
    dtype), and never frees: per slot and decoder linear layer, an A of rank x inputs for each merged part (counted
    twice: gate and up have two, q, k and v three, the others one) and a B of outputs x rank; the token embedding's A
    and the LM head's B, vocabulary x rank each. The KV cache is sized after it, as a CPU engine's cache is given in
    bytes. Against vLLM's own tensors: +9% on the demo model, +14% on the bench model (docs/performance.md)."""
    adapters = model.lora_adapters
    rank = _rank(adapters) if adapters else None
    if rank is None:
        return 0
    per_layer = sum(2 * k + n for k, n in model.linear_shapes)
    per_rank = per_layer * model.num_layers + 2 * (model.vocab_size or 0)
    return len(adapters) * rank * per_rank * dtype_bytes


def lora_decisions(model: ModelFacts, served_name: str) -> PolicyResult:
    adapters = model.lora_adapters
    if not adapters:
        return PolicyResult.of()
    errors = []
    if model.is_embedding:
        errors.append("lora_adapters: the model is a pooling model; vLLM serves LoRA adapters on generation models")
    if clash := [a.name for a in adapters if a.name == served_name]:
        errors.append(f"lora_adapters: {clash[0]!r} is the served model's own name; give the adapter another")
    errors += [problem for adapter in adapters if (problem := _misfit(adapter, model)) is not None]
    widest = max(adapters, key=lambda a: a.rank)
    rank = _rank(adapters)
    if rank is None:
        errors.append(
            f"lora_adapters: {widest.name!r} has rank {widest.rank}; vLLM serves ranks up to {LORA_RANKS[-1]}"
        )
    names = ", ".join(f"{a.name} (r={a.rank})" for a in adapters)
    modules = [{"name": a.name, "path": a.path} for a in adapters]
    return PolicyResult.of(
        engine("enable_lora", True, f"LoRA adapters set by the user: {names}", "user"),
        engine(
            "lora_modules", modules, "each adapter is served under its own name; a request names it in `model`", "user"
        ),
        engine(
            "max_lora_rank",
            rank,
            f"the smallest rank vLLM allows ({', '.join(map(str, LORA_RANKS))}) that holds the widest adapter, "
            f"{widest.name} (r={widest.rank}): each slot is sized for it",
            "policy",
        ),
        engine(
            "max_loras",
            len(adapters),
            "a slot for every adapter: one batch can hold requests for all of them, none waits for a slot",
            "policy",
        ),
        env(
            LORA_ROWS_ENV,
            "1",
            "vLLM's CPU LoRA ops apply the last adapter slot to base-model tokens batched with an adapter's (vllm#48421, "
            "open; a base request's greedy text took the adapter's first token on the demo model): every vLLM process "
            "zeroes their delta (service/lora_rows.py)",
            "policy",
        ),
        errors=errors,
    )
