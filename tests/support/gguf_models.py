"""Tiny GGUF files for the tests, written with gguf-py (llama.cpp's own writer and tensor-name map) from tiny random
Hugging Face models: llama, mistral (a llama GGUF whose name says mistral, as llama.cpp writes them), qwen2, qwen3,
in any tensor type the issue lists, or a mix of them (MIXES). The weights go through what llama.cpp's converter does
to them (its Q/K row permutation for llama-style rotary) and gguf-py's quantizers; K-quant types, which gguf-py
cannot quantize, get random blocks with small scales (what they decode to is then the model). The tokenizer is the
demo's byte-level BPE. Dimensions are multiples of 256, the K-quants' block."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.ggml_blocks import blocks_of

VERSION = "v1"  # bump when the recipe changes, so caches rebuild
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, LAYERS = 256, 512, 4, 2, 2
# Mixes: (the type of most tensors, {tensor: its type}). Q4_K_M as llama-quantize writes it keeps some layers' attn_v
# and ffn_down in Q6_K (here layer 0's, so one merged q/k/v mixes types and the other does not); Q4_0+Q8_0 mixes the
# same way with types gguf-py quantizes, so the model is the HF model's, not random blocks.
_LAYER0_V_DOWN = ("model.layers.0.self_attn.v_proj", "model.layers.0.mlp.down_proj")
MIXES = {
    "Q4_K_M": ("Q4_K", dict.fromkeys(_LAYER0_V_DOWN, "Q6_K")),
    "Q4_0+Q8_0": ("Q4_0", dict.fromkeys(_LAYER0_V_DOWN, "Q8_0")),
}


@dataclass(frozen=True)
class Arch:
    gguf: str  # general.architecture
    config: str  # transformers config class
    name: str  # general.name
    permute_qk: bool  # llama.cpp permutes Q/K rows of llama-style models
    tied: bool = True


ARCHES = {
    "llama": Arch("llama", "LlamaConfig", "tiny llama", permute_qk=True),
    "mistral": Arch("llama", "MistralConfig", "tiny mistral", permute_qk=True, tied=False),
    "qwen2": Arch("qwen2", "Qwen2Config", "tiny qwen2", permute_qk=False),  # with q/k/v biases
    "qwen3": Arch("qwen3", "Qwen3Config", "tiny qwen3", permute_qk=False, tied=False),  # with q/k norms
}


def tiny_gguf(cache: Path, arch: str, tensor_type: str, seed: int = 0) -> Path:
    """`cache/gguf/tiny-<arch>-<type>-<version>.gguf`, written once (atomically)."""
    path = cache / "gguf" / f"tiny-{arch}-{tensor_type}-{VERSION}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write_gguf(Path(staging), ARCHES[arch], tensor_type, seed, cache)
        os.replace(staging, path)
    finally:
        Path(staging).unlink(missing_ok=True)
    return path


def _hf_model(arch: Arch, seed: int):
    import torch
    import transformers

    config = getattr(transformers, arch.config)(
        vocab_size=2048,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HIDDEN // HEADS,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=arch.tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    return config, model


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: rotary halves interleaved per head."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _encode(values: np.ndarray, tensor_type: str, rng: np.random.Generator):
    """(data, raw dtype) of one tensor: 1-D tensors and norms stay F32, as llama.cpp writes them."""
    from gguf import GGMLQuantizationType

    if values.ndim == 1 or tensor_type == "F32":
        return values.astype(np.float32), None
    if tensor_type == "F16":
        return values.astype(np.float16), None
    return blocks_of(values, tensor_type, rng), GGMLQuantizationType[tensor_type]


def _tokenizer(cache: Path) -> tuple[list[str], list[int], list[str], str]:
    from service.models.demo_model import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer

    directory = cache / f"gguf-tokenizer-{VERSION}"
    if not (directory / "tokenizer.json").is_file():
        build_tokenizer(directory)
    model = json.loads((directory / "tokenizer.json").read_text())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    types = [3 if token in SPECIAL_TOKENS else 1 for token in tokens]  # control / normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges, CHAT_TEMPLATE


def write_gguf(path: Path, arch: Arch, tensor_type: str, seed: int, cache: Path) -> None:
    import gguf

    config, model = _hf_model(arch, seed)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, arch.gguf)
    writer.add_name(arch.name)
    writer.add_block_count(LAYERS)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HIDDEN // HEADS)
    writer.add_value_length(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(config.vocab_size)
    tokens, types, merges, template = _tokenizer(cache)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(template)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.gguf.upper()], LAYERS)
    for hf_name, tensor in model.state_dict().items():
        if arch.tied and hf_name == "lm_head.weight":
            continue
        base, _, suffix = hf_name.rpartition(".")
        values = tensor.numpy()
        if arch.permute_qk and base.endswith(("q_proj", "k_proj")):
            values = _permute(values, HEADS if base.endswith("q_proj") else KV_HEADS)
        most, exceptions = MIXES.get(tensor_type, (tensor_type, {}))
        data, raw = _encode(values, exceptions.get(base, most), rng)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def relabelled(source: Path, out: Path, architecture: str) -> Path:
    """`source` (a llama file) with its metadata under another general.architecture (llama.* keys renamed): a file
    transformers' mapping reads as that architecture, for what the service decides before anything is served."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    writer = GGUFWriter(out, architecture)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = architecture + name.removeprefix("llama") if name.startswith("llama.") else name
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
