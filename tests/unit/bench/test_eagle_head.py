"""bench/tools/eagle_head.py: the head it writes is the one vLLM's EAGLE loader reads, and its prompts leave the bench's
workloads out."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from bench.tools.eagle_head import Head, agreement, prompts, save


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_the_prompts_come_from_installed_packages_and_not_from_the_bench_workloads():
    asked = prompts(40)
    assert len(asked) == len(set(asked)) > 10
    assert not any("httpx" in a.lower().split("\n")[0] for a in asked)


def test_the_head_is_saved_as_vllm_loads_an_eagle_head_and_starts_out_passing_the_state_through(tmp_path):
    target = tiny_llama()
    head = Head(target)
    last = target.model.layers[-1].state_dict()
    assert torch.equal(head.layer.mlp.gate_proj.weight, last["mlp.gate_proj.weight"])
    embeds, hidden = torch.randn(1, 5, 16), torch.randn(1, 5, 16)
    with torch.no_grad():
        assert torch.allclose(head(embeds, hidden), hidden, atol=1e-6)
    target.config.quantization_config = {"quant_method": "gguf"}  # as transformers loads a GGUF file
    save(head, target, tmp_path, [{"epoch": 1}], {"target": "tiny"})
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert "fc.weight" in weights and weights["fc.weight"].shape == (16, 32)
    # vLLM's llama_eagle.py: layer 0 has no input norm; embeddings and LM head are the target's
    assert {k.split(".")[0] for k in weights} == {"fc", "layers"}
    assert not [k for k in weights if "input_layernorm" in k or "embed" in k or "lm_head" in k]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config  # vLLM refuses a gguf quantization on a directory
    ids = torch.randint(0, 64, (12,))
    with torch.no_grad():
        hidden = target(ids[None], output_hidden_states=True).hidden_states[-1][0]
    assert 0.0 <= agreement(head, target, [(ids, hidden)]) <= 1.0
