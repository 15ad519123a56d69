"""A GGUF file -> what it holds, without reading its tensor data: the architecture, the Hugging Face config that
transformers' GGUF mapping derives from its metadata, the tokenizer kind and chat template, the tensor types, and
the bytes a decode step reads.

gguf-py (llama.cpp's own reader) reads the tensor table; transformers' `load_gguf_checkpoint` maps the metadata to a
Hugging Face config, the mapping its own `from_pretrained(gguf_file=...)` uses. A file that is not GGUF, is cut
short, or carries an architecture that mapping lacks raises `GgufError` naming what is wrong.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.facts.gguf_reader import shared_readers

MAGIC = b"GGUF"
# GGUF token types (llama.cpp's llama_token_type): control tokens are special, user-defined ones are added tokens.
_CONTROL, _USER_DEFINED = 3, 4
# The tensors a decode step does not read whole: an untied token embedding is a row lookup.
_EMBEDDING, _OUTPUT = "token_embd.weight", "output.weight"
# The decoder's linear layers, by llama.cpp's tensor names: what a file's blocks can serve as they are (attn_qkv:
# Phi-3's fused q/k/v).
# A MoE file's shared expert (qwen2moe's `_shexp`) is a dense MLP in vLLM's model too; its routed experts (`_exps`, one
# 3-D tensor per projection) are not: vLLM's fused-MoE layer computes dense weights only.
LINEAR_TENSOR = re.compile(
    r"blk\.\d+\.(?:attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up|ffn_down)(?:_shexp)?\.weight"
)
# llama.cpp's file names end in the quantization ("Qwen3-0.6B-Q8_0.gguf", "model.Q4_K_M.gguf").
_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d[\w]*|[BF]F?16|F32)$", re.IGNORECASE)


# How llama.cpp splits text before BPE, per `tokenizer.ggml.pre`, for the pre-tokenizers transformers' GGUF mapping
# has no rule for (it falls back to GPT-2's split for those): regexes applied in turn, each piece of one split by
# the next (llama.cpp src/llama-vocab.cpp, the llama-cpp-python 0.3.36 sdist that `make bench-tools` builds).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA_CPP_SPLITS: dict[str, tuple[str, ...]] = {
    pre: (r"\p{N}", _GPT2_SPLIT) for pre in ("smollm", "codeshell", "exaone", "minerva-7b", "mellum2")
}
# Names for GPT-2's own split, which transformers' byte-level GGUF tokenizer applies by default.
GPT2_SPLIT_NAMES = frozenset({"default", "gpt2", "gpt-2", "mpt", "olmo", "jais", "trillion", "granite-docling"})
# Where a file does not say (tokenizer.ggml.add_bos_token), llama.cpp puts a BOS before a text for SentencePiece and
# WordPiece vocabularies and for these BPE pre-tokenizers (src/llama-vocab.cpp, llama.cpp as llama-cpp-python 0.3.36
# vendors it); transformers' mapping adds none then.
LLAMA_CPP_BOS_VOCABULARIES = frozenset({"llama", "bert"})
LLAMA_CPP_BOS_PRE_TOKENIZERS = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "tekken"}
    | {"chameleon"}
)


class GgufError(ValueError):
    pass


@dataclass(frozen=True)
class HeadTensor:
    """The token embedding or the output head, as the file stores it."""

    name: str  # token_embd.weight or output.weight
    type_name: str  # its ggml type
    n_bytes: int
    n_elements: int
    read_per_token: bool  # the LM head's weight (output, or the token embedding where the head is tied to it)


@dataclass(frozen=True)
class GgufFacts:
    path: str
    size_bytes: int
    sha256: str  # of the whole file: the converted copy is keyed by content
    architecture: str  # general.architecture, e.g. "llama"
    name: str | None  # general.name
    model_type: str  # the Hugging Face model_type transformers maps it to
    hf_architecture: str | None  # the causal-LM class transformers has for that model_type, e.g. "LlamaForCausalLM"
    config: dict[str, Any]  # the Hugging Face config transformers derives from the metadata
    tokenizer: str | None  # tokenizer.ggml.model: "gpt2", "llama", ...
    tokenizer_error: str | None  # why transformers cannot build a tokenizer from the metadata, if it cannot
    pre_tokenizer: str | None  # tokenizer.ggml.pre: how llama.cpp splits text before BPE ("smollm", "qwen2", ...)
    # The split rule the converted tokenizer gets: llama.cpp's regexes where transformers has none for this
    # pre-tokenizer, () where transformers' own rule (or GPT-2's default) is llama.cpp's, None where neither is known.
    split_rules: tuple[str, ...] | None
    chat_template: str | None
    added_tokens: tuple[tuple[str, bool], ...]  # (content, special) of control and user-defined tokens
    tensor_types: tuple[tuple[str, int], ...]  # (ggml type name, tensor count), most frequent first
    undecodable_types: tuple[str, ...]  # types gguf-py cannot dequantize
    parameters: int
    read_per_token_bytes: int  # bytes of the tensors a decode step reads, as stored in the file
    read_per_token_elements: int  # elements of those tensors
    # The decoder's linear weights (LINEAR_TENSOR): (type name, tensor count) and their bytes and elements as stored.
    linear_types: tuple[tuple[str, int], ...] = ()
    linear_bytes: int = 0
    linear_elements: int = 0
    linear_type_elements: tuple[tuple[str, int], ...] = ()  # (type name, elements) of those weights, per type
    heads: tuple[HeadTensor, ...] = ()  # the token embedding and the output head, where the file has them
    adds_bos: bool = False  # whether llama.cpp puts a BOS before a text: the file's key, else llama.cpp's default
    # llama.cpp's per-dimension rope frequency divisors (rope_freqs.weight: Llama 3.1's "llama3" scaling, stored as
    # its computed factors), which transformers' mapping drops
    rope_freqs: tuple[float, ...] | None = None
    longrope_tensors: tuple[str, ...] = ()  # rope_factors_long/short: Phi-3's LongRoPE factors, dropped too
    # The file's scalar (and short list) "<architecture>.*" keys, by name without the prefix: what llama.cpp reads and transformers'
    # mapping may not (Gemma 2's soft-capping)
    architecture_keys: tuple[tuple[str, Any], ...] = ()

    @property
    def served_name(self) -> str:
        """The file's name without the quantization llama.cpp's naming appends."""
        stem = Path(self.path).stem
        return _QUANT_SUFFIX.sub("", stem) or stem

    def describe_types(self) -> str:
        return ", ".join(f"{name} x{count}" for name, count in self.tensor_types)


def find_gguf(path: Path) -> Path | None:
    """`path` itself if it is a file (a Hugging Face model is a directory); the one .gguf file of a directory
    without a config.json; else None."""
    if path.is_file():
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.glob("*.gguf") if p.is_file())
    if len(found) > 1:
        raise GgufError(f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found)}): name one")
    return found[0] if found else None


def _has_magic(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == MAGIC


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_gguf(path: Path) -> GgufFacts:
    stat = path.stat()
    return _read_gguf(path, stat.st_size, stat.st_mtime_ns)


@functools.cache
def _read_gguf(path: Path, size: int, mtime_ns: int) -> GgufFacts:
    """Read once per process and file version: the header of a large vocabulary takes seconds to parse."""
    if not _has_magic(path):
        raise GgufError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    with shared_readers():  # transformers' mapping (_hf_mapping) parses the header again otherwise
        from gguf import GGUFReader

        try:
            reader = GGUFReader(path)
        except (ValueError, IndexError, OSError) as exc:  # gguf-py reads past the end of a cut-off header
            raise GgufError(f"{path} is not a readable GGUF file (truncated or corrupt header: {exc})") from exc
        # The tensor data of a complete file ends within it; a cut-off download does not.
        for tensor in reader.tensors:
            end = int(tensor.data_offset) + int(tensor.n_bytes)
            if end > size:
                raise GgufError(
                    f"{path} is truncated: tensor {tensor.name} ends at byte {end}, the file has {size} bytes"
                )
        return _facts(path, size, reader)


def _facts(path: Path, size: int, reader: Any) -> GgufFacts:
    config, tokenizer, tokenizer_config = _hf_mapping(path)
    architecture = str(_field(reader, "general.architecture") or "")
    # The head size as the file states it: transformers maps none for some architectures (qwen2, qwen3) and the
    # config class's default then need not match the tensors.
    head_dim = _field(reader, f"{architecture}.attention.key_length")
    if head_dim is not None:
        config["head_dim"] = int(head_dim)
    names = {t.name for t in reader.tensors}
    read_whole = {t.name for t in reader.tensors if t.name != _EMBEDDING or _OUTPUT not in names}
    decode_reads = [t for t in reader.tensors if t.name in read_whole]
    linear = [t for t in reader.tensors if LINEAR_TENSOR.fullmatch(t.name)]
    tokens = tokenizer.get("tokens") or []
    types = tokenizer.get("token_type") or []
    added = tuple((str(tok), kind == _CONTROL) for tok, kind in zip(tokens, types) if kind in (_CONTROL, _USER_DEFINED))
    model_type = str(config.get("model_type") or "")
    return GgufFacts(
        path=str(path),
        size_bytes=size,
        sha256=_sha256(path),
        architecture=architecture,
        name=_field(reader, "general.name"),
        model_type=model_type,
        hf_architecture=_causal_lm_class(model_type),
        config=config,
        tokenizer=tokenizer.get("tokenizer_type"),
        tokenizer_error=_tokenizer_error(architecture, tokenizer),
        pre_tokenizer=tokenizer.get("pre_tokenizer_type"),
        split_rules=_split_rules(tokenizer),
        chat_template=tokenizer_config.get("chat_template"),
        added_tokens=added,
        tensor_types=tuple(Counter(t.tensor_type.name for t in reader.tensors).most_common()),
        undecodable_types=tuple(sorted({t.tensor_type.name for t in reader.tensors if not _decodable(t.tensor_type)})),
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        read_per_token_bytes=sum(int(t.n_bytes) for t in decode_reads),
        read_per_token_elements=sum(int(t.n_elements) for t in decode_reads),
        linear_types=tuple(Counter(t.tensor_type.name for t in linear).most_common()),
        linear_bytes=sum(int(t.n_bytes) for t in linear),
        linear_elements=sum(int(t.n_elements) for t in linear),
        linear_type_elements=tuple(_elements_by_type(linear).most_common()),
        heads=tuple(
            HeadTensor(t.name, t.tensor_type.name, int(t.n_bytes), int(t.n_elements), t.name in read_whole)
            for t in reader.tensors
            if t.name in (_EMBEDDING, _OUTPUT)
        ),
        adds_bos=_adds_bos(_field(reader, "tokenizer.ggml.add_bos_token"), tokenizer),
        rope_freqs=_rope_freqs(reader),
        longrope_tensors=tuple(t.name for t in reader.tensors if t.name.startswith("rope_factors_")),
        architecture_keys=_architecture_keys(reader, architecture),
    )


def _architecture_keys(reader: Any, architecture: str) -> tuple[tuple[str, Any], ...]:
    prefix = f"{architecture}."
    found = ((name.removeprefix(prefix), _field(reader, name)) for name in reader.fields if name.startswith(prefix))
    # Scalars, and short lists (a per-layer pattern): not the token tables
    return tuple(
        sorted(
            (k, tuple(v) if isinstance(v, list) else v)
            for k, v in found
            if isinstance(v, (int, float, str, bool)) or (isinstance(v, list) and len(v) <= 1024)
        )
    )


def _rope_freqs(reader: Any) -> tuple[float, ...] | None:
    import numpy as np
    from gguf.quants import dequantize

    found = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if found is None:
        return None
    return tuple(float(v) for v in np.asarray(dequantize(found.data, found.tensor_type)).reshape(-1))


def _elements_by_type(tensors: list[Any]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for t in tensors:
        counts[t.tensor_type.name] += int(t.n_elements)
    return counts


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _hf_mapping(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """transformers' GGUF -> Hugging Face mapping of the metadata: (config, tokenizer, tokenizer_config)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)  # type: ignore[no-untyped-call]
    except ValueError as exc:  # "GGUF model with architecture X is not supported yet."
        raise GgufError(f"{path}: transformers' GGUF mapping cannot read it: {exc}") from exc
    config = {k: v for k, v in parsed["config"].items() if not k.startswith("_")}
    return config, parsed.get("tokenizer") or {}, parsed.get("tokenizer_config") or {}


def _tokenizer_error(architecture: str, tokenizer: dict[str, Any]) -> str | None:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import select_tokenizer_builder

    try:
        select_tokenizer_builder(architecture, tokenizer.get("tokenizer_type"))
    except ValueError as exc:
        return str(exc)
    return None


def _adds_bos(stored: Any, tokenizer: dict[str, Any]) -> bool:
    if stored is not None:
        return bool(stored)
    vocabulary = tokenizer.get("tokenizer_type")
    pre = tokenizer.get("pre_tokenizer_type")
    return vocabulary in LLAMA_CPP_BOS_VOCABULARIES or (vocabulary == "gpt2" and pre in LLAMA_CPP_BOS_PRE_TOKENIZERS)


def _split_rules(tokenizer: dict[str, Any]) -> tuple[str, ...] | None:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    pre = tokenizer.get("pre_tokenizer_type")
    if tokenizer.get("tokenizer_type") != "gpt2" or pre in GGUF_PRE_TOKENIZER_SPLITS or pre in GPT2_SPLIT_NAMES:
        return ()  # not byte-level BPE (sentencepiece, unigram), or transformers splits as llama.cpp does
    return LLAMA_CPP_SPLITS.get(str(pre))


def _decodable(qtype: Any) -> bool:
    """Whether gguf-py dequantizes this type (tried on one zero block: its public API has no list)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    block_bytes = GGML_QUANT_SIZES[qtype][1]
    try:
        dequantize(np.zeros(block_bytes, dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _causal_lm_class(model_type: str) -> str | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    return name if isinstance(name, str) else None
