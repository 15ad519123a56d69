"""LoRA adapters served beside the model: vLLM's LoRA engine arguments, sized from the adapters' own configs.

vLLM serves an adapter only when its rank fits `max_lora_rank` (one of a fixed list) and keeps `max_loras` of them in
one batch; the policy takes the smallest rank that fits them all and room for every adapter at once, so a request
for one never waits on another's. A slot holds max_lora_rank x (inputs + outputs) values per linear layer: small next
to the model. Adapters loaded while serving (the lora_dir setting) share one more slot, sized for lora_max_rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.facts.lora import AdapterFacts
from service.facts.model import ModelFacts
from service.in_vllm.contract import LORA_ROWS_ENV
from service.policy.plan.decision import PolicyResult, engine, env

# "1": every vLLM process leaves base-model tokens out of the LoRA ops (service/in_vllm/lora_rows.py), as the plugin reads it.

# vLLM 0.32's MaxLoRARanks (vllm/config/lora.py); tests/unit/in_vllm/test_lora.py checks them against it.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The rank adapters loaded while serving may have when lora_max_rank is unset: PEFT's default rank (LoraConfig.r)
# is 8; 16 leaves room for twice that at twice the slot's memory.
RUNTIME_RANK = 16


@dataclass(frozen=True)
class LoraRuntime:
    """Adapters loaded while serving: from where, and how wide they may be."""

    directory: Path
    rank: int


def lora_runtime(lora_dir: Path | None, max_rank: int | None, adapters: tuple[AdapterFacts, ...]) -> LoraRuntime | None:
    """None: the adapters are those set at start. Unset max_rank: RUNTIME_RANK, or the widest set at start."""
    if lora_dir is None:
        return None
    return LoraRuntime(lora_dir, max_rank or max([RUNTIME_RANK, *(a.rank for a in adapters)]))


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


def _rank(adapters: tuple[AdapterFacts, ...], runtime: LoraRuntime | None) -> int | None:
    """The smallest rank vLLM allows that holds the widest adapter; None: wider than any."""
    widest = max([*(a.rank for a in adapters), *((runtime.rank,) if runtime else ())])
    return next((r for r in LORA_RANKS if r >= widest), None)


def _slots(adapters: tuple[AdapterFacts, ...], runtime: LoraRuntime | None) -> int:
    return len(adapters) + (runtime is not None)


def lora_slot_bytes(model: ModelFacts, dtype_bytes: int, runtime: LoraRuntime | None = None) -> int:
    """About what vLLM allocates at start for `max_loras` slots of `max_lora_rank` (vllm/lora/layers, in the model's
    dtype), and never frees: per slot and decoder linear layer, an A of rank x inputs for each merged part (counted
    twice: gate and up have two, q, k and v three, the others one) and a B of outputs x rank; the token embedding's A
    and the LM head's B, vocabulary x rank each. The KV cache is sized after it, as a CPU engine's cache is given in
    bytes. It errs high against vLLM's own tensors (claim/lora-slot-bytes/xeon-amx)."""
    adapters = model.lora_adapters
    rank = _rank(adapters, runtime) if adapters or runtime else None
    if rank is None:
        return 0
    per_layer = sum(2 * k + n for k, n in model.linear_shapes)
    per_rank = per_layer * model.num_layers + 2 * (model.vocab_size or 0)
    return _slots(adapters, runtime) * rank * per_rank * dtype_bytes


def adapter_misfit(adapter: AdapterFacts, model: ModelFacts, max_lora_rank: int) -> str | None:
    """Why an adapter loaded while serving cannot be: it is wider than the slots, or made for another model."""
    if adapter.rank > max_lora_rank:
        return (
            f"LoRA adapter {adapter.name!r} has rank {adapter.rank}; this engine's adapter slots hold rank "
            f"{max_lora_rank} (set lora_max_rank to load wider ones)"
        )
    return _misfit(adapter, model)


def _widest(adapters: tuple[AdapterFacts, ...], runtime: LoraRuntime | None) -> str:
    widest = max(adapters, key=lambda a: a.rank, default=None)
    if runtime is not None and (widest is None or runtime.rank > widest.rank):
        return f"adapters loaded while serving (lora_max_rank, r={runtime.rank})"
    return f"the widest adapter, {widest.name} (r={widest.rank})" if widest else "no adapter"


def _runtime_errors(runtime: LoraRuntime | None, max_rank: int | None) -> list[str]:
    if runtime is None and max_rank:
        return ["lora_max_rank: it sizes adapters loaded while serving; set lora_dir too"]
    return []


def lora_decisions(
    model: ModelFacts, served_name: str, runtime: LoraRuntime | None = None, max_rank: int | None = None
) -> PolicyResult:
    """`max_rank`: the lora_max_rank setting, refused without a lora_dir (`runtime`)."""
    adapters = model.lora_adapters
    errors = _runtime_errors(runtime, max_rank)
    if not adapters and runtime is None:
        return PolicyResult(errors=tuple(errors))
    if model.is_embedding:
        errors.append("LoRA: the model is a pooling model; vLLM serves LoRA adapters on generation models")
    if clash := [a.name for a in adapters if a.name == served_name]:
        errors.append(f"lora_adapters: {clash[0]!r} is the served model's own name; give the adapter another")
    errors += [problem for adapter in adapters if (problem := _misfit(adapter, model)) is not None]
    rank = _rank(adapters, runtime)
    widest = _widest(adapters, runtime)
    if rank is None:
        errors.append(f"LoRA: {widest} is wider than vLLM serves (ranks up to {LORA_RANKS[-1]})")
    names = ", ".join(f"{a.name} (r={a.rank})" for a in adapters)
    enabled = f"LoRA adapters set by the user: {names}" if adapters else "LoRA adapters set by the user"
    if runtime:
        enabled += f"; more may be loaded from {runtime.directory} while serving (lora_dir)"
    slots = (
        "a slot for every adapter set at start: one batch can hold requests for all of them, none waits for a slot"
        if adapters
        else ""
    )
    if runtime:
        shared = "one slot that the adapters loaded while serving share (vLLM swaps in the one a batch needs)"
        slots = f"{slots}, and {shared}" if slots else shared
    modules = [{"name": a.name, "path": a.path} for a in adapters]
    return PolicyResult.of(
        engine("enable_lora", True, enabled, "user"),
        engine(
            "lora_modules", modules, "each adapter is served under its own name; a request names it in `model`", "user"
        )
        if adapters
        else None,
        engine(
            "max_lora_rank",
            rank,
            f"the smallest rank vLLM allows ({', '.join(map(str, LORA_RANKS))}) that holds {widest}: each slot is "
            "sized for it",
            "policy",
        ),
        engine("max_loras", _slots(adapters, runtime), slots, "policy"),
        env(
            LORA_ROWS_ENV,
            "1",
            "vLLM's CPU LoRA ops apply the last adapter slot to base-model tokens batched with an adapter's (vllm#48421, "
            "open; a base request's greedy text took the adapter's first token on the demo model): every vLLM process "
            "zeroes their delta (service/in_vllm/lora_rows.py)",
            "policy",
        ),
        errors=errors,
    )
