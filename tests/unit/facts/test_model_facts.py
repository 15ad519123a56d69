"""Model facts from recorded real configs (tests/fixtures/models), the packaged MiniLM model and a fake HF cache."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.facts.model import ModelNotFound, inspect_model, packaged_embedding_model_path, resolve_model_path

FIXTURES = Path(__file__).parents[2] / "fixtures" / "models"


def facts(name: str):
    return inspect_model(str(FIXTURES / name))


def write_config(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_dense_llama():
    f = facts("llama-3.1-8b-instruct")
    assert (f.architecture, f.model_type) == ("LlamaForCausalLM", "llama")
    assert not f.has_linear_attention and not f.uses_mla and not f.is_embedding
    assert (f.num_layers, f.full_attention_layers, f.linear_attention_layers) == (32, 32, 0)
    assert (f.num_kv_heads, f.head_dim) == (8, 128)
    assert f.declared_dtype == "bfloat16"
    assert f.max_context == 131072
    assert f.quantization is None
    # No shards in the fixture: the index's declared total stands in for them.
    assert f.weight_bytes == 16060522496
    # 2 (K and V) x 32 layers x 8 heads x 128 dims x 2 bytes = 128 KiB per token.
    assert f.kv_bytes_per_token(2) == 131072


def test_qwen3_next_rebuilds_gdn_layers_from_full_attention_interval():
    f = facts("qwen3-next-80b-a3b-instruct")
    assert f.architecture == "Qwen3NextForCausalLM"
    assert f.has_linear_attention
    # Every 4th of 48 layers is full attention; the other 36 are Gated DeltaNet.
    assert (f.linear_attention_layers, f.full_attention_layers) == (36, 12)
    assert (f.num_kv_heads, f.head_dim, f.max_context) == (2, 256, 262144)
    assert f.kv_bytes_per_token(2) == 2 * 12 * 2 * 256 * 2


def test_qwen3_5_reads_nested_text_config():
    f = facts("qwen3.5-397b-a17b")
    assert (f.architecture, f.model_type) == ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")
    assert f.has_linear_attention
    assert (f.num_layers, f.linear_attention_layers, f.full_attention_layers) == (60, 45, 15)
    assert (f.num_kv_heads, f.head_dim) == (2, 256)
    assert f.declared_dtype == "bfloat16"
    assert f.max_context == 262144
    assert not f.is_embedding


def test_deepseek_v3_mla_and_fp8():
    f = facts("deepseek-v3")
    assert f.uses_mla and not f.has_linear_attention
    assert (f.kv_lora_rank, f.qk_rope_head_dim) == (512, 64)
    assert f.head_dim == 128 + 64  # nope + rope, not hidden/heads (= 56)
    assert f.quantization == "fp8"
    assert f.max_context == 163840
    assert f.num_layers == 61
    # MLA caches one latent (512) plus the rope key (64) per layer.
    assert f.kv_bytes_per_token(2) == 61 * (512 + 64) * 2


def test_kimi_linear_kda_layers_and_mla():
    f = facts("kimi-linear-48b-a3b-instruct")
    assert f.has_linear_attention and f.uses_mla
    assert (f.linear_attention_layers, f.full_attention_layers) == (20, 7)
    assert f.max_context == 1048576  # only model_max_length is declared
    assert f.declared_dtype == "bfloat16"  # newer configs say `dtype`, not `torch_dtype`


def test_gptq_w4a16():
    f = facts("qwen2.5-7b-instruct-gptq-int4")
    assert f.quantization == "gptq-w4a16"
    assert f.declared_dtype == "float16"
    assert (f.num_kv_heads, f.head_dim) == (4, 128)


def test_compressed_tensors_w8a8():
    f = facts("meta-llama-3.1-8b-instruct-quantized.w8a8")
    assert f.quantization == "compressed-tensors-w8a8"
    assert f.weight_bytes == 9083502592


@pytest.mark.parametrize(
    ("quantization_config", "expected"),
    [
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}, "input_activations": None}},
            },
            "compressed-tensors-w4a16",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {
                        "weights": {"num_bits": 8, "type": "float"},
                        "input_activations": {"num_bits": 8, "type": "float"},
                    }
                },
            },
            "compressed-tensors-fp8",
        ),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}, "awq-w4a16"),
        ({"quant_method": "mxfp4"}, "mxfp4"),
    ],
)
def test_quantization_schemes(tmp_path, quantization_config, expected):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2}
    write_config(tmp_path, {**config, "quantization_config": quantization_config})
    assert inspect_model(str(tmp_path)).quantization == expected


def test_olmo_hybrid_default_layout(tmp_path):
    write_config(
        tmp_path,
        {
            "architectures": ["OlmoHybridForCausalLM"],
            "model_type": "olmo_hybrid",
            "num_hidden_layers": 8,
            "num_attention_heads": 4,
            "hidden_size": 256,
        },
    )
    f = inspect_model(str(tmp_path))
    assert (f.linear_attention_layers, f.full_attention_layers) == (6, 2)
    assert (f.num_kv_heads, f.head_dim) == (4, 64)  # kv heads fall back to attention heads


def test_sliding_window_layers_still_count_as_kv_layers(tmp_path):
    write_config(
        tmp_path,
        {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        },
    )
    f = inspect_model(str(tmp_path))
    assert not f.has_linear_attention
    assert f.full_attention_layers == 3


def test_bert_model_is_embedding():
    f = facts("bge-small-en-v1.5")
    assert f.is_embedding
    assert (f.architecture, f.max_context, f.declared_dtype) == ("BertModel", 512, "float32")
    assert f.weight_bytes == 0  # config only, nothing on disk and no index


def test_generative_architectures_named_model_are_not_embedders(tmp_path):
    """Every generative architecture of the pinned vLLM whose name ends in "Model" (ChatGLMModel, ...).

    Listed in a subprocess: importing vLLM applies its torch overrides process-wide."""
    script = (
        "from vllm.model_executor.models import registry as r\n"
        "names = {**r._TEXT_GENERATION_MODELS, **r._MULTIMODAL_MODELS}\n"
        "print(' '.join(n for n in names if n.endswith('Model')))"
    )
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    names = done.stdout.split()
    assert "ChatGLMModel" in names
    for name in names:
        write_config(tmp_path, {"architectures": [name], "model_type": "x", "num_hidden_layers": 1})
        assert not inspect_model(str(tmp_path)).is_embedding, name


def test_sentence_transformers_layout_makes_a_causal_lm_an_embedder(tmp_path):
    # Qwen3-Embedding declares Qwen3ForCausalLM; only modules.json says it is a sentence embedder.
    write_config(tmp_path, {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 28})
    assert not inspect_model(str(tmp_path)).is_embedding
    (tmp_path / "modules.json").write_text("[]")
    assert inspect_model(str(tmp_path)).is_embedding


def test_weight_bytes_sum_safetensors_on_disk(tmp_path):
    write_config(tmp_path, {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1})
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 500)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 9999)  # ignored when safetensors exist
    index = {
        "metadata": {"total_size": 1400},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert inspect_model(str(tmp_path)).weight_bytes == 1500
    # One shard missing (partial download): the declared total is the better figure.
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    assert inspect_model(str(tmp_path)).weight_bytes == 1400


def test_weight_bytes_fall_back_to_bin(tmp_path):
    write_config(
        tmp_path,
        {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_layer": 12,
            "n_head": 12,
            "n_embd": 768,
            "n_positions": 1024,
        },
    )
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 321)
    f = inspect_model(str(tmp_path))
    assert f.weight_bytes == 321
    assert not f.is_embedding  # GPT2LMHeadModel ends in "Model" but has an LM head
    assert (f.num_layers, f.max_context, f.num_kv_heads) == (12, 1024, 12)


def test_packaged_minilm_model():
    path = packaged_embedding_model_path()
    assert path is not None and (path / "model.safetensors").is_file()
    f = inspect_model(str(path))
    assert f.is_embedding
    assert (f.architecture, f.model_type, f.num_layers) == ("BertModel", "bert", 6)
    assert f.weight_bytes > 80_000_000
    assert f.max_context == 256  # sentence_bert_config.json caps the 512 positions
    assert f.path == str(path.resolve())


def fake_hub_cache(cache: Path, repo_id: str, revision: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """The hub cache layout: models--org--name/{refs/main, snapshots/<rev>/...}."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    shutil.copytree(FIXTURES / "llama-3.1-8b-instruct", snapshot)
    return snapshot


def test_hub_id_resolves_to_cached_snapshot(tmp_path):
    snapshot = fake_hub_cache(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    assert resolve_model_path("meta-llama/Llama-3.1-8B-Instruct", hf_cache=tmp_path) == snapshot
    f = inspect_model("meta-llama/Llama-3.1-8B-Instruct", hf_cache=tmp_path)
    assert f.path == str(snapshot)
    assert f.architecture == "LlamaForCausalLM"


def test_hub_id_missing_from_cache_is_a_clear_error(tmp_path):
    fake_hub_cache(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(ModelNotFound, match=r"'Qwen/Qwen3-8B' is neither a local directory nor present in cache"):
        resolve_model_path("Qwen/Qwen3-8B", hf_cache=tmp_path)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFound, match="does not exist"):
        resolve_model_path(str(tmp_path / "nowhere"))


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelNotFound, match="no config.json"):
        inspect_model(str(tmp_path))


def _checkpoint(directory: Path, tensors: dict, quantization: dict | None = None) -> Path:
    import torch
    from safetensors.torch import save_file

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8}
    write_config(directory, config | ({"quantization_config": quantization} if quantization else {}))
    save_file(
        {k: torch.zeros(shape, dtype=getattr(torch, t)) for k, (shape, t) in tensors.items()},
        directory / "a.safetensors",
    )
    return directory


def test_decode_reads_leave_out_the_embedding_table_unless_it_is_the_lm_head(tmp_path):
    layers = {"model.layers.0.mlp.up_proj.weight": ((32, 16), "bfloat16"), "model.norm.weight": ((16,), "float32")}
    embedding = {"model.embed_tokens.weight": ((100, 16), "bfloat16")}
    untied = _checkpoint(tmp_path / "untied", {**layers, **embedding, "lm_head.weight": ((100, 16), "bfloat16")})
    tied = _checkpoint(tmp_path / "tied", {**layers, **embedding})
    assert inspect_model(str(untied)).decode_reads.float_elements == 32 * 16 + 16 + 100 * 16
    assert inspect_model(str(tied)).decode_reads.float_elements == 32 * 16 + 16 + 100 * 16  # the table is the head
    assert inspect_model(str(untied)).decode_reads.bytes_in(4) == (32 * 16 + 16 + 1600) * 4


def test_decode_reads_count_the_decoders_projection_weights_apart(tmp_path):
    """What the bf16-weight kernel can hold in bf16: 2-D `layers.N.*_proj.weight` tensors, not norms, heads or
    MoE experts."""
    reads = inspect_model(
        str(
            _checkpoint(
                tmp_path,
                {
                    "model.layers.0.self_attn.q_proj.weight": ((16, 16), "bfloat16"),
                    "model.layers.0.mlp.down_proj.weight": ((16, 32), "bfloat16"),
                    "model.layers.0.mlp.experts.0.up_proj.weight": ((32, 16), "bfloat16"),
                    "model.layers.0.input_layernorm.weight": ((16,), "bfloat16"),
                    "lm_head.weight": ((100, 16), "bfloat16"),
                    "model.embed_tokens.weight": ((100, 16), "bfloat16"),
                },
            )
        )
    ).decode_reads
    assert reads.projection_elements == 16 * 16 + 16 * 32
    assert reads.float_elements == 16 * 16 + 16 * 32 + 32 * 16 + 16 + 100 * 16
    assert reads.bytes_in(4, 2) == reads.float_elements * 4 - reads.projection_elements * 2


def test_decode_reads_count_quantized_values_as_stored(tmp_path):
    reads = inspect_model(
        str(
            _checkpoint(
                tmp_path / "q",
                {
                    "model.layers.0.mlp.up_proj.weight_packed": ((32, 2), "int32"),
                    "model.layers.0.mlp.up_proj.weight_scale": ((32, 1), "bfloat16"),
                    "model.embed_tokens.weight": ((100, 16), "bfloat16"),
                    "lm_head.weight": ((100, 16), "bfloat16"),
                },
            )
        )
    ).decode_reads
    assert (reads.packed_bytes, reads.float_elements) == (32 * 2 * 4, 32 + 1600)
    assert reads.bytes_in(2) == 256 + 1632 * 2


_INT8_CT = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}
    },
}


@pytest.mark.parametrize(
    ("quantization", "layer", "weights"),
    [
        # GPTQ int4: qweight [k / 8, n], qzeros, scales per group of 16 and g_idx
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 16},
            {
                "qweight": ((4, 32), "int32"),
                "qzeros": ((2, 4), "int32"),
                "scales": ((2, 32), "float16"),
                "g_idx": ((32,), "int32"),
            },
            32 * 32,
        ),
        # compressed-tensors W8A8: an int8 weight [n, k] and a scale per channel
        (_INT8_CT, {"weight": ((32, 64), "int8"), "weight_scale": ((32, 1), "bfloat16")}, 32 * 64),
    ],
)
def test_decode_reads_count_quantized_layers_apart_for_kernels_that_hold_them_as_blocks(
    tmp_path, quantization, layer, weights
):
    """ggml's kernels hold a quantized layer as 32-weight blocks with their scales: the reads then count the layer's
    logical weights, not its tensors as stored."""
    others = {"model.norm.weight": ((16,), "float32"), "lm_head.weight": ((100, 16), "bfloat16")}
    tensors = {f"model.layers.0.mlp.up_proj.{k}": v for k, v in layer.items()} | others
    reads = inspect_model(str(_checkpoint(tmp_path, tensors, quantization))).decode_reads
    side_floats = sum(math.prod(shape) for shape, t in layer.values() if not t.startswith("int"))
    assert reads.quantized_weights == weights
    assert reads.quantized_float_elements == side_floats
    assert reads.quantized_packed_bytes == reads.packed_bytes  # every integer tensor belongs to the layer
    assert reads.bytes_as_blocks(4, 18) == (16 + 1600) * 4 + weights * 18 // 32
    unquantized = inspect_model(str(_checkpoint(tmp_path / "plain", tensors))).decode_reads
    assert (unquantized.quantized_weights, unquantized.quantized_packed_bytes) == (0, 0)


def test_decode_reads_as_blocks_count_unquantized_projections_as_the_bf16_kernel_holds_them(tmp_path):
    """A checkpoint that left a projection unquantized (its ignore list), in an fp32 engine whose bf16 kernel keeps
    that projection in bf16: the block-holding kernel's reads count it at 2 bytes, the other floats at 4."""
    tensors = {
        "model.layers.0.mlp.up_proj.weight": ((32, 64), "int8"),
        "model.layers.0.mlp.up_proj.weight_scale": ((32, 1), "bfloat16"),
        "model.layers.0.self_attn.o_proj.weight": ((64, 64), "bfloat16"),
        "model.norm.weight": ((16,), "float32"),
    }
    reads = inspect_model(str(_checkpoint(tmp_path, tensors, _INT8_CT))).decode_reads
    assert reads.projection_elements == 64 * 64
    others = 16 + 64 * 64
    assert reads.bytes_as_blocks(4, 34) == others * 4 + 32 * 64 * 34 // 32
    assert reads.bytes_as_blocks(4, 34, 2) == 16 * 4 + 64 * 64 * 2 + 32 * 64 * 34 // 32
    assert reads.bytes_as_blocks(2, 34, 2) == others * 2 + 32 * 64 * 34 // 32


def test_decode_reads_of_a_damaged_shard_are_unknown(tmp_path):
    directory = write_config(tmp_path / "bad", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    (directory / "a.safetensors").write_bytes(b"\xff" * 8 + b"{not json")
    assert inspect_model(str(directory)).decode_reads is None


WEIGHTS = {"model.layers.0.mlp.up_proj.weight": ((32, 16), "float32"), "lm_head.weight": ((100, 16), "float32")}


def test_intact_shards_have_no_weight_problems(tmp_path):
    assert inspect_model(str(_checkpoint(tmp_path / "ok", WEIGHTS))).weight_problems == ()


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda shard: os.truncate(shard, shard.stat().st_size - 1), "a.safetensors is truncated"),
        (lambda shard: os.truncate(shard, 20), "shorter than its own header"),
        (lambda shard: shard.write_bytes((30).to_bytes(8, "little") + b"{not json" + b" " * 40), "no readable"),
        (lambda shard: shard.write_bytes((2).to_bytes(8, "little") + b"[]"), "no readable"),
        (lambda shard: shard.write_bytes((10).to_bytes(8, "little") + b'{"w": {}} '), "no readable"),
        (lambda shard: (shard.unlink(), shard.symlink_to(shard.parent / "blobs" / "gone")), "which is not there"),
        (
            lambda shard: shard.write_text(
                "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 538090408\n"
            ),
            "a.safetensors is a Git LFS pointer, not the weights: the repository was cloned without git-lfs",
        ),
    ],
    ids=[
        "one-byte-short",
        "cut-inside-the-header",
        "header-not-json",
        "header-a-list",
        "entry-without-offsets",
        "link-to-a-missing-blob",
        "git-lfs-pointer",
    ],
)
def test_a_damaged_shard_is_named_before_the_engine_loads_it(tmp_path, damage, words):
    directory = _checkpoint(tmp_path / "bad", WEIGHTS)
    damage(directory / "a.safetensors")
    facts = inspect_model(str(directory))
    assert len(facts.weight_problems) == 1 and words in facts.weight_problems[0], facts.weight_problems
    assert facts.decode_reads is None


def test_shards_the_index_names_but_the_directory_lacks_are_named(tmp_path):
    directory = _checkpoint(tmp_path / "partial", WEIGHTS)
    weight_map = {"lm_head.weight": "a.safetensors", "model.norm.weight": "model-00002-of-00002.safetensors"}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert inspect_model(str(directory)).weight_problems == (
        "model.safetensors.index.json names shards the directory lacks: model-00002-of-00002.safetensors",
    )
    (directory / "a.safetensors").unlink()  # no shard at all: a config to inspect, as the recorded fixtures are
    assert inspect_model(str(directory)).weight_problems == ()


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_a_json_file_that_is_not_json_is_named(tmp_path, name):
    directory = write_config(tmp_path / "m", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    (directory / name).write_text('{"architectures": ["LlamaForCausalLM"]')
    with pytest.raises(ValueError, match=rf"^{name} is not valid JSON: "):
        inspect_model(str(directory))
