"""What the engine loads and under which name: a model directory as it is, or a GGUF file's converted copy.

vLLM 0.32 has no GGUF loader, so a GGUF file is converted once into the cache: its blocks dequantized to the
engine dtype, its metadata mapped to a Hugging Face config and tokenizer by transformers' GGUF mapping. The copy is
keyed by the file's content, the dtype and the converter's versions, so a changed file or converter makes a new one
and an unchanged one is reused. Which GGUF files can be served is checked here, before anything is converted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.facts.gguf import GgufFacts
from service.facts.model import ModelFacts
from service.facts.software import SoftwareFacts
from service.policy.decision import PolicyResult, record
from service.policy.dtype import BYTES

# Bump when the conversion's output changes for the same inputs (layout, files written, tokenizer rules).
CONVERTER_VERSION = "2"


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


@dataclass(frozen=True)
class ModelSourcePlan:
    engine_model: str  # what vLLM loads: a directory (or a hub id in the local cache)
    served_name: str
    result: PolicyResult
    conversion: GgufConversion | None = None


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
) -> ModelSourcePlan:
    """`architectures`: the text-generation classes the installed vLLM has (empty: not checked);
    `served_name`: the user's, if set; `known_as`: the name the model was asked for by (the demo's, a hub id)."""
    gguf = model.gguf
    if gguf is None:
        name = served_name or known_as or Path(model.path).name
        why = "set by the user" if served_name else "the name it was asked for by" if known_as else "its directory"
        decision = record("model", "served_name", name, why, "user" if served_name else "default")
        return ModelSourcePlan(model.path, name, PolicyResult.of(decision))

    name = served_name or gguf.served_name
    why_name = "set by the user" if served_name else "the GGUF file's name without its quantization suffix"
    named = record("model", "served_name", name, why_name, "user" if served_name else "default")
    errors = gguf_errors(gguf, architectures, software)
    converter = converter_key(software)
    key = hashlib.sha256(converter.encode()).hexdigest()[:8]
    # Named by content alone: the same file under another name or path is the same copy.
    target = cache_dir / "models" / "gguf" / f"{gguf.sha256[:16]}-{dtype}-{key}"
    before, after = gguf.read_per_token_bytes, gguf.read_per_token_elements * BYTES[dtype]
    reason = (
        f"GGUF file {gguf.path} ({gguf.architecture}, {gguf.parameters / 1e6:,.1f} M parameters, "
        f"{gguf.describe_types()}; {_mb(gguf.size_bytes)}) converted once to {dtype} safetensors, the engine dtype "
        f"(vLLM 0.32 has no GGUF loader): every block dequantized, config and tokenizer from the metadata by "
        f"transformers' GGUF mapping{_split_note(gguf)}; keyed by the file's sha256 {gguf.sha256[:12]} and the converter ({converter}). "
        f"A decode step reads {_mb(before)} as the file stores it, {_mb(after)} as converted (x{after / before:.2f})"
    )
    source = record("model", "source", str(target), reason, "policy")
    conversion = GgufConversion(
        gguf.path,
        gguf.sha256,
        dtype,
        str(target),
        converter,
        gguf.architecture,
        dict(gguf.config),
        gguf.split_rules or (),
    )
    warnings = []
    if gguf.split_rules is None:
        warnings.append(
            f"GGUF file {gguf.path}: neither transformers nor the service knows llama.cpp's pre-tokenizer "
            f"{gguf.pre_tokenizer!r}; the converted tokenizer splits text as GPT-2 does, which may tokenize some "
            "text differently from llama.cpp"
        )
    result = PolicyResult.of(named, source, warnings=warnings, errors=errors)
    return ModelSourcePlan(str(target), name, result, conversion)
