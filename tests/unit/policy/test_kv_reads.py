"""What a decode step reads of the KV cache at agent depth (policy/engine/kv_reads.py), from the configs of the shapes users
run: recorded model directories (tests/fixtures/models) and configs laid out as their families write them."""

from __future__ import annotations

import pytest

from service.facts.model import _facts_from_config, inspect_model
from service.policy.engine.kv_reads import kv_read_per_token, sessions_at_depth
from tests.unit.conftest import MODELS

LLAMA_3B = {  # Llama-3.2-3B's decoder shape
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "hidden_size": 3072,
    "head_dim": 128,
    "max_position_embeddings": 131072,
}
GEMMA3_270M = {  # Gemma 3 270M: one KV head, a 512-token window on all but every sixth of its 18 layers
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "hidden_size": 640,
    "sliding_window": 512,
    "max_position_embeddings": 32768,
}


def test_a_full_attention_model_reads_its_whole_cache_at_each_depth():
    facts = _facts_from_config(LLAMA_3B, None)
    (decision,) = kv_read_per_token(facts, 4, 32768)
    per_token = 2 * 28 * 8 * 128 * 4  # K and V, every layer, fp32
    assert decision.setting == "model.kv_read_per_token"
    assert decision.value == {4096: 4096 * per_token, 16384: 16384 * per_token, 32768: 32768 * per_token}
    assert "28 attention layers x 8 KV heads of 128" in decision.reason and "4 bytes" in decision.reason
    # bf16 storage reads half of it
    assert kv_read_per_token(facts, 2, 32768)[0].value[16384] * 2 == decision.value[16384]


@pytest.mark.parametrize("listed", [False, True])
def test_sliding_layers_read_only_their_window(listed):
    """Gemma 3's layer_types as transformers writes them, or rebuilt from its pattern where the config omits them."""
    config = dict(GEMMA3_270M)
    if listed:
        config["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]
    facts = _facts_from_config(config, None)
    assert (facts.sliding_window, facts.sliding_layers) == (512, 15)
    per_layer_token = 2 * 1 * 256 * 2
    (decision,) = kv_read_per_token(facts, 2, 32768)
    assert decision.value[16384] == per_layer_token * (3 * 16384 + 15 * 512)
    assert "15 of them see only a 512-token window" in decision.reason


def test_a_window_the_config_turns_off_is_no_window():
    facts = _facts_from_config(LLAMA_3B | {"sliding_window": 4096, "use_sliding_window": False}, None)
    assert facts.sliding_layers == 0 and facts.kv_read_at(16384, 2) == 16384 * facts.kv_bytes_per_token(2)


def test_depths_past_the_context_are_left_out_and_a_short_context_reads_at_its_end():
    facts = _facts_from_config(LLAMA_3B, None)
    assert list(kv_read_per_token(facts, 2, 8192)[0].value) == [4096]
    assert list(kv_read_per_token(facts, 2, 2048)[0].value) == [2048]


def test_a_recorded_models_plan_says_what_it_reads_and_how_many_sessions_fit():
    facts = inspect_model(str(MODELS / "llama-3.1-8b-instruct"))
    (decision,) = kv_read_per_token(facts, 2, 32768)
    assert decision.value[32768] == 32768 * 2 * 32 * 8 * 128 * 2  # 32 layers x 8 KV heads of 128, bf16
    assert sessions_at_depth(100_000, 32768, 256) == "sessions held at once: 24 of 4k, 6 of 16k, 3 of 32k"
    assert sessions_at_depth(100_000, 32768, 4) == "sessions held at once: 4 of 4k, 4 of 16k, 3 of 32k"
