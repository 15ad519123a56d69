"""What the engine loads and under which name: a model directory as it is, or a GGUF file's converted copy.

vLLM 0.32 has no CPU GGUF loader, so a GGUF file is converted once into the cache: its linear layers' blocks kept
for ggml's kernel where the file allows (choose_blocks), the rest dequantized to the engine dtype, its metadata
mapped to a Hugging Face config and tokenizer by transformers' GGUF mapping. The copy is keyed by the file's
content, the dtype and the converter's versions, so a changed file or converter makes a new one and an unchanged one
is reused. Which GGUF files can be served is checked here, before anything is converted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.facts.gguf import GgufFacts, HeadTensor
from service.facts.model import ModelFacts
from service.facts.software import KERNELS_NOT_BUILT, SoftwareFacts
from service.in_vllm.contract import KERNELS_ENV
from service.kernels.registry import KERNELS
from service.measurements.store import cite
from service.policy.engine.dtype import BYTES
from service.policy.gguf.gguf_architectures import architecture_problem
from service.policy.gguf.gguf_config import config_mends
from service.policy.gguf.gguf_rope import rope_config
from service.policy.plan.decision import Decision, PolicyResult, Source, env, record

# Bump when the conversion's output changes for the same inputs (layout, files written, tokenizer rules).
CONVERTER_VERSION = "12"


@dataclass(frozen=True)
class GgufConversion:
    """A GGUF file to convert into `target` (a Hugging Face model directory in the engine dtype)."""

    source: str
    sha256: str
    dtype: str
    target: str
    converter: str  # the versions the copy is keyed on
    architecture: str  # general.architecture: which of transformers' tensor processors applies
    config: dict[str, Any]  # the Hugging Face config, as the facts mapped it
    split_rules: tuple[str, ...]  # llama.cpp's pre-tokenizer regexes, where transformers has none (else empty)
    weight_bytes: int  # what the copy's weights take on disk (converted_bytes)
    blocks: str | None = None  # the ggml types whose blocks the linear layers keep, "+"-joined (None: all dequantized)
    heads: tuple[str, ...] = ()  # the token embedding and output tensors that keep their blocks (kept_heads)
    adds_bos: bool = False  # the converted tokenizer puts a BOS before a text, as llama.cpp does on the file


@dataclass(frozen=True)
class ModelSourcePlan:
    engine_model: str  # what vLLM loads: a directory (or a hub id in the local cache)
    served_name: str
    result: PolicyResult
    conversion: GgufConversion | None = None


# What the service's GGUF method (service/kernels/gguf_blocks.py) serves from a file's own blocks: the types ggml's
# CPU matmul computes, for the architectures whose tensors transformers' mapping only renames or reorders by row and
# whose blocks a test serves through the engine against llama.cpp (tests/integration/test_gguf_file.py,
# test_real_model_quality.py and test_gguf_blocks_llama_cpp.py's BLOCKS_ENGINE).
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
BLOCK_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe")
BLOCKS_KERNEL = KERNELS["ggml-gguf"]
# What keeping blocks rests on: ggml's kernel against the dequantized engine on the same CPU (docs/quantization.md).
BLOCKS_MEASURED = cite("claim/gguf-blocks-dequantized/zen4")


# What keeping the LM head's blocks rests on: ggml's matmul on them against the head dequantized to the engine dtype.
HEAD_MEASURED = cite("claim/lm-head-blocks/emeraldrapids")


@dataclass(frozen=True)
class BlocksChoice:
    type_name: str | None  # the types the linear layers keep ("Q4_K+Q6_K" for a mix), or None (dequantized)
    reason: str
    source: Source
    error: str | None = None


def choose_blocks(
    gguf: GgufFacts, asked: str, user: bool, kernels_built: str | None, default_model: bool, tp_size: int = 1
) -> BlocksChoice:
    """Whether the file's linear layers keep their blocks. `asked`: the gguf_blocks setting; `user`: the user set it."""
    source: Source = "user" if user else "policy"
    if asked == "off":
        return BlocksChoice(None, "set by the user (gguf_blocks=off)", "user")
    if asked == "auto" and default_model:
        why = (
            "the packaged default model is served dequantized, for answers checked against its fp32 reference; "
            "gguf_blocks=on serves its blocks on ggml's kernel"
        )
        return BlocksChoice(None, why, "default")
    types = dict(gguf.linear_types)
    hidden, inner = gguf.config.get("hidden_size"), gguf.config.get("intermediate_size")
    why_not = None
    if gguf.architecture not in BLOCK_ARCHITECTURES:
        why_not = f"the service keeps blocks for {', '.join(BLOCK_ARCHITECTURES)} files, not {gguf.architecture!r}"
    elif not types:
        why_not = "the file has none of llama.cpp's decoder linear tensors"
    elif others := [t for t in types if t not in BLOCK_TYPES]:
        why_not = (
            f"its linear layers include {', '.join(others)}, not a type ggml's kernel computes "
            f"({', '.join(BLOCK_TYPES)})"
        )
    elif tp_size > 1 and len(types) > 1:
        mix = ", ".join(f"{name} x{count}" for name, count in gguf.linear_types)
        why_not = f"its linear layers mix types ({mix}), which the service splits across one rank only"
    elif tp_size > 1 and any(
        isinstance(d, int) and (d // tp_size) % _block_values(t) for d in (hidden, inner) for t in types
    ):
        why_not = f"tensor-parallel size {tp_size} would split its {'/'.join(types)} blocks"
    elif not kernels_built:
        why_not = KERNELS_NOT_BUILT
    if why_not is not None:
        if asked == "on":
            return BlocksChoice(None, why_not, source, f"gguf_blocks=on was set, but {why_not}")
        return BlocksChoice(None, why_not, "policy")
    why = "set by the user (gguf_blocks=on)" if asked == "on" else BLOCKS_MEASURED
    if len(types) > 1:  # a K-quant mix (Q4_K_M: Q4_K, some layers' v and down in Q6_K)
        why += "; each layer, and each part of a merged q/k/v or gate/up, on ggml's kernel for its type"
    return BlocksChoice("+".join(sorted(types)), why, source)


def _block_values(type_name: str) -> int:
    return 256 if type_name.endswith("_K") else 32


# Architectures whose vLLM model builds its token embedding without the quant config: blocks would reach a float
# weight (vLLM 0.32's gemma2.py), so the embedding and a head tied to it are dequantized.
HEADS_DEQUANTIZED = {"gemma2": "vLLM's Gemma 2 builds its token embedding without a quantization method"}


def kept_heads(gguf: GgufFacts) -> tuple[HeadTensor, ...]:
    """The token embedding and output tensors that keep their blocks when the linear layers do: those of a type
    ggml's kernel computes, whose rows (the hidden size) are whole blocks. The embedding's row lookup dequantizes the
    looked-up rows; the LM head is ggml's matmul."""
    if gguf.architecture in HEADS_DEQUANTIZED:
        return ()
    hidden = gguf.config.get("hidden_size")
    return tuple(
        h
        for h in gguf.heads
        if h.type_name in BLOCK_TYPES and isinstance(hidden, int) and hidden % _block_values(h.type_name) == 0
    )


# Bytes per 32-block that ggml's op adds to a type as the file stores it: Q4_1 (fp16 d and m, 16 nibble bytes: 20)
# is held as the ggml-q4_1 kernel holds a checkpoint's zero-point int4: repacked Q4_0 plus an fp32 offset per block
# (ggml_linear.cpp split_q4_1).
HELD_EXTRA_PER_BLOCK = {"Q4_1": (KERNELS["ggml-q4_1"].block_bytes or 20) - 20}
HELD_AS = {
    "Q4_1": "Q4_1 as repacked Q4_0 plus an fp32 offset per 32-block, 22 bytes a block where the file stores 20 "
    "(as stored where a layer's rows do not repack in eights or an offset is not exact in fp32)"
}


def kept_bytes(gguf: GgufFacts, per_token: bool) -> tuple[int, int]:
    """(bytes, elements) of the tensors that keep their blocks: all of them as the file stores them, or
    (`per_token`) those a decode step reads whole, as ggml's op holds them (HELD_EXTRA_PER_BLOCK)."""
    heads = [h for h in kept_heads(gguf) if h.read_per_token or not per_token]
    stored = gguf.linear_bytes + sum(h.n_bytes for h in heads)
    elements = gguf.linear_elements + sum(h.n_elements for h in heads)
    if not per_token:
        return stored, elements
    typed = [*gguf.linear_type_elements, *((h.type_name, h.n_elements) for h in heads)]
    return stored + sum(n // 32 * HELD_EXTRA_PER_BLOCK.get(t, 0) for t, n in typed), elements


def held_as(gguf: GgufFacts) -> tuple[str, ...]:
    """How ggml's op holds the kept types that differ from the file's layout (HELD_AS)."""
    types = {*dict(gguf.linear_type_elements), *(h.type_name for h in kept_heads(gguf))}
    return tuple(HELD_AS[t] for t in sorted(types) if t in HELD_AS)


def converted_bytes(gguf: GgufFacts, dtype: str, kept_blocks: str | None) -> int:
    """The weights' bytes once converted: the kept blocks as the file stores them, every other element in `dtype`."""
    stored_bytes, stored_elements = kept_bytes(gguf, per_token=False) if kept_blocks else (0, 0)
    return stored_bytes + (gguf.parameters - stored_elements) * BYTES[dtype]


def _describe_heads(heads: tuple[HeadTensor, ...], tied: bool) -> str:
    roles = {"token_embd.weight": "token embedding", "output.weight": "LM head"}
    return ", ".join(
        f"{h.type_name} ({roles[h.name]}{', the tied LM head' if tied and h.name == 'token_embd.weight' else ''})"
        for h in heads
    )


def _no_head_blocks(gguf: GgufFacts) -> str:
    if not gguf.heads:
        return "the file has no token embedding or output tensor"
    if gguf.architecture in HEADS_DEQUANTIZED:
        return HEADS_DEQUANTIZED[gguf.architecture]
    types = ", ".join(f"{h.name} {h.type_name}" for h in gguf.heads)
    return (
        f"{types}: not a type ggml's kernel computes ({', '.join(BLOCK_TYPES)}) in whole blocks of the hidden size "
        f"{gguf.config.get('hidden_size')}"
    )


def converter_key(software: SoftwareFacts) -> str:
    return f"service converter {CONVERTER_VERSION}, transformers {software.transformers}, gguf-py {software.gguf}"


def gguf_errors(gguf: GgufFacts, architectures: frozenset[str], software: SoftwareFacts) -> list[str]:
    """Why this GGUF file cannot be served, before anything is converted."""
    where = f"GGUF file {gguf.path} (architecture {gguf.architecture!r})"
    errors = []
    if gguf.hf_architecture is None:
        errors.append(
            f"{where}: transformers {software.transformers} maps it to model_type {gguf.model_type!r}, which has no "
            "causal language model class"
        )
    elif architectures and gguf.hf_architecture not in architectures:
        errors.append(f"{where}: {gguf.hf_architecture} is not a text-generation model of vLLM {software.vllm}")
    if gguf.undecodable_types:
        errors.append(
            f"{where}: tensor types {', '.join(gguf.undecodable_types)} cannot be dequantized (gguf-py "
            f"{software.gguf}); the converter takes F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, Q2_K-Q6_K and IQ types"
        )
    if gguf.tokenizer_error:
        errors.append(f"{where}: no tokenizer from its metadata: {gguf.tokenizer_error}")
    return errors


def _split_note(gguf: GgufFacts) -> str:
    if gguf.split_rules:
        return f" (text split by llama.cpp's {gguf.pre_tokenizer!r} rules, which transformers lacks)"
    return ""


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB"


def plan_model_source(
    model: ModelFacts,
    dtype: str,
    cache_dir: Path,
    software: SoftwareFacts,
    architectures: frozenset[str],
    served_name: str | None = None,
    known_as: str | None = None,
    blocks: BlocksChoice | None = None,
    serve_unchecked: bool = False,
    loadable: frozenset[str] = frozenset(),
) -> ModelSourcePlan:
    """`architectures`: the text-generation classes the installed vLLM has (empty: not checked);
    `served_name`: the user's, if set; `known_as`: the name the model was asked for by (the demo's, a hub id);
    `blocks`: whether a GGUF file's linear layers keep their blocks (choose_blocks; None: dequantized);
    `serve_unchecked`: serve a GGUF architecture no test checks (gguf_architectures.py), with a warning;
    `loadable`: every model class vLLM can load, its own or through transformers (empty: not checked)."""
    if model.gguf is None:
        return _checkpoint_source(model, served_name, known_as, loadable)
    return _gguf_source(
        model.gguf, dtype, cache_dir, software, architectures, served_name, known_as, blocks, serve_unchecked
    )


def _served_name(served_name: str | None, known_as: str | None, own: str, own_why: str) -> tuple[str, Decision]:
    """The name the model is served under: the user's, the one it was asked for by, or its own."""
    name = served_name or known_as or own
    why = "set by the user" if served_name else "the name it was asked for by" if known_as else own_why
    return name, record("model", "served_name", name, why, "user" if served_name else "default")


def _checkpoint_source(
    model: ModelFacts, served_name: str | None, known_as: str | None, loadable: frozenset[str]
) -> ModelSourcePlan:
    """A checkpoint directory is loaded as it is: its name, and whether its weights and architecture can be."""
    name, decision = _served_name(served_name, known_as, Path(model.path).name, "its directory")
    problems = "; ".join(model.weight_problems)
    errors = [f"the weights in {model.path} cannot be loaded: {problems}. Copy or download them again"]
    errors = errors if problems else []
    if loadable and model.architecture and model.architecture not in loadable:
        errors.append(
            f"the model's architecture {model.architecture!r} is neither in vLLM's model registry nor one of "
            "transformers' classes (which vLLM runs through its Transformers backend): it cannot be served"
        )
    return ModelSourcePlan(model.path, name, PolicyResult.of(decision, errors=errors))


def _gguf_source(
    gguf: GgufFacts,
    dtype: str,
    cache_dir: Path,
    software: SoftwareFacts,
    architectures: frozenset[str],
    served_name: str | None,
    known_as: str | None,
    blocks: BlocksChoice | None,
    serve_unchecked: bool,
) -> ModelSourcePlan:
    """A GGUF file is converted once to safetensors in the engine dtype (its blocks kept where `blocks` says)."""
    name, named = _served_name(
        served_name, known_as, gguf.served_name, "the GGUF file's name without its quantization suffix"
    )
    errors = gguf_errors(gguf, architectures, software)
    unchecked_error, unchecked_warning = architecture_problem(gguf.architecture, serve_unchecked)
    errors += [f"GGUF file {gguf.path}: {unchecked_error}"] if unchecked_error else []
    rope_entries, rope_why, rope_error = rope_config(gguf)
    mended, mend_why = config_mends(gguf)
    errors += [rope_error] if rope_error else []
    converter = converter_key(software)
    kept = blocks.type_name if blocks is not None else None
    heads = kept_heads(gguf) if kept else ()
    # The heads kept are a policy of their own (HEADS_DEQUANTIZED): a copy made under another is another copy.
    key = hashlib.sha256("".join([converter, *(h.name for h in heads)]).encode()).hexdigest()[:8]
    # Named by content alone: the same file under another name or path is the same copy.
    target = cache_dir / "models" / "gguf" / f"{gguf.sha256[:16]}-{dtype}-{key}{f'-{kept}' if kept else ''}"
    reason = _conversion_reason(gguf, dtype, kept, heads, converter)
    decided = [named, record("model", "source", str(target), reason, "policy")]
    if rope_why:
        decided.append(record("model", "gguf_rope", "rope_freqs as LongRoPE factors", rope_why, "policy"))
    if mend_why:
        decided.append(record("model", "gguf_config", mended, mend_why, "policy"))
    decided += _block_decisions(gguf, blocks, heads)
    conversion = GgufConversion(
        gguf.path,
        gguf.sha256,
        dtype,
        str(target),
        converter,
        gguf.architecture,
        {**gguf.config, **rope_entries, **mended},
        gguf.split_rules or (),
        converted_bytes(gguf, dtype, kept),
        kept,
        tuple(h.name for h in heads),
        gguf.adds_bos,
    )
    warnings = [f"GGUF file {gguf.path}: {unchecked_warning}"] if unchecked_warning else []
    if gguf.split_rules is None:
        warnings.append(
            f"GGUF file {gguf.path}: neither transformers nor the service knows llama.cpp's pre-tokenizer "
            f"{gguf.pre_tokenizer!r}; the converted tokenizer splits text as GPT-2 does, which may tokenize some "
            "text differently from llama.cpp"
        )
    if blocks is not None and blocks.error:
        errors.append(blocks.error)
    result = PolicyResult.of(*decided, warnings=warnings, errors=errors)
    return ModelSourcePlan(str(target), name, result, conversion)


def _conversion_reason(
    gguf: GgufFacts, dtype: str, kept: str | None, heads: tuple[HeadTensor, ...], converter: str
) -> str:
    """What the conversion keeps and dequantizes, and what a decode step reads before and after."""
    before, after = gguf.read_per_token_bytes, gguf.read_per_token_elements * BYTES[dtype]
    tied = not any(h.name == "output.weight" for h in gguf.heads)
    if kept:
        read_bytes, read_elements = kept_bytes(gguf, per_token=True)
        after = read_bytes + (gguf.read_per_token_elements - read_elements) * BYTES[dtype]
        what = f"its linear layers' {kept} blocks"
        if heads:
            what += f" and its {_describe_heads(heads, tied)} blocks"
        what += f" copied as stored, for ggml's kernel; {'norms' if heads else 'embeddings and norms'} dequantized"
        what += "".join(f"; ggml holds {h}" for h in held_as(gguf))
        if gguf.config.get("num_experts"):
            what += "; its routed experts and router dequantized: vLLM's fused-MoE layer computes dense weights only"
    else:
        what = "every block dequantized"
    return (
        f"GGUF file {gguf.path} ({gguf.architecture}, {gguf.parameters / 1e6:,.1f} M parameters, "
        f"{gguf.describe_types()}; {_mb(gguf.size_bytes)}) converted once to {dtype} safetensors, the engine dtype "
        f"(vLLM 0.32 has no CPU GGUF loader): {what}, config and tokenizer from the metadata by "
        f"transformers' GGUF mapping{_split_note(gguf)}; keyed by the file's sha256 {gguf.sha256[:12]} and the converter ({converter}). "
        f"A decode step reads {_mb(before)} as the file stores it, {_mb(after)} as the engine holds it "
        f"(x{after / before:.2f})"
    )


def _block_decisions(gguf: GgufFacts, blocks: BlocksChoice | None, heads: tuple[HeadTensor, ...]) -> list[Decision]:
    """Whether the blocks are kept, the kernel that runs them, and whether the LM head keeps its own."""
    if blocks is None:
        return []
    kept = blocks.type_name
    decided = [record("model", "gguf_blocks", kept or "dequantized", blocks.reason, blocks.source)]
    if kept:
        tied = not any(h.name == "output.weight" for h in gguf.heads)
        op = f"{BLOCKS_KERNEL.op}; the service's vLLM plugin registers it"
        decided.append(env(KERNELS_ENV, BLOCKS_KERNEL.vllm_class, op, blocks.source))
        head_value = _describe_heads(heads, tied) if heads else "dequantized"
        head_why = HEAD_MEASURED if heads else _no_head_blocks(gguf)
        decided.append(record("model", "gguf_head_blocks", head_value, head_why, "policy"))
    return decided
