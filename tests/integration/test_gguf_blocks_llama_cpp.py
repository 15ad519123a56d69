"""A GGUF file of an architecture beyond llama/qwen served on its own blocks (service/policy/model_source.
BLOCK_ARCHITECTURES) through the real engine, against llama.cpp on the same quantized file (the files and llama.cpp's
helpers of test_gguf_llama_cpp.py). A file of its own: its five engines run in the first stream of `make test`, the
rest of the llama.cpp checks beside it (scripts/test.sh)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from service.policy.gguf.model_source import HEADS_DEQUANTIZED
from tests.integration.test_gguf_llama_cpp import GREEDY, llama_cpp_quantized
from tests.integration.test_reference import TEXTS
from tests.support import llama_cpp
from tests.support.reference import compare

# A file's Q8_0 blocks in the engine against llama.cpp on them, both with 8-bit activations per 32-block. Measured on
# a Zen 3 guest (2026-12-05), 72 of 72 greedy tokens each: Gemma 3 logprob max 0.47 / mean 0.042 (the fp32 file
# through the engine: 0.008 / 0.0009; transformers on the dequantized Q8_0 file, fp32 activations: 0.39 / 0.067),
# Gemma 2 0.084 / 0.012, Phi-3 0.052 / 0.0038. The default
# model's Q4_1 file, the same comparison: 0.35 / 0.071 (test_real_model_quality.py's GGUF_BLOCKS: 1.5 / 0.15).
BLOCKS_MAX_DIFF, BLOCKS_MEAN_DIFF, BLOCKS_TIE = 1.0, 0.1, 0.5

BLOCKS_ENGINE = ("gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe")
# A MoE file's tensors that stay dense: the routed experts (3-D), the router and the shared expert's gate.
EXPERT_SIDE = re.compile(r"\.(?:ffn_\w+_exps|ffn_gate_inp(?:_shexp)?)\.weight$")


@pytest.mark.engine
@pytest.mark.parametrize("name", BLOCKS_ENGINE)
def test_the_engine_serves_a_files_blocks_as_llama_cpp_does(server_logs, name):
    """A file of an architecture beyond llama/qwen on its own blocks (service/policy/model_source.BLOCK_ARCHITECTURES),
    through the real engine: every linear layer and the token embedding, which the LM head is tied to, in Q8_0 on
    ggml's kernel (Gemma 2's embedding dequantized: HEADS_DEQUANTIZED); vLLM's model of it on the converted copy
    (Gemma 2/3: the embedding scale, soft-capping, sliding window; Phi-3: its fused q/k/v and gate/up, each one ggml
    handle), against llama.cpp on the same quantized file. Both quantize the activations to Q8_0 for ggml's
    dot products; where the two differ by a rounding upstream, a value lands in the next 8-bit step (BLOCKS_*)."""
    import httpx
    from gguf import GGUFReader
    from openai import OpenAI

    from tests.integration.conftest import _start
    from tests.support.reference import prompt_ids, query
    from tests.support.release import release

    gguf = llama_cpp_quantized(name, "Q8_0")
    server = _start(
        f"gguf-arch-blocks/{name}", server_logs, gguf.stem, model=str(gguf), kv_cache_gib="0.25", dtype="float32"
    )
    try:
        report = httpx.get(f"{server.url}/v1/hardware", timeout=30).json()
        decisions = {d["setting"]: d for d in report["decisions"]}
        converted = Path(decisions["model.source"]["value"])
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        served = [query(client, gguf.stem, ids, GREEDY) for ids in prompt_ids(converted, TEXTS)]
        log = server.process.log_tail(10**6)
    finally:
        release(server.process)
    assert (decisions["model.gguf_blocks"]["value"], decisions["model.gguf_blocks"]["source"]) == ("Q8_0", "policy")
    assert "[service] GGUF blocks: Q8_0 linear layers on ggml's kernel" in log
    # The embedding the head is tied to, on its blocks where vLLM's model gives it a quantization method
    embedding = "[service] GGUF blocks: Q8_0 VocabParallelEmbedding on ggml's kernel"
    assert (embedding in log) == (name not in HEADS_DEQUANTIZED), decisions["model.gguf_head_blocks"]
    # Every matrix of the file's blocks kept as blocks, a fused one (Phi-3's attn_qkv) and a MoE's shared expert
    # included: none dequantized but a MoE's routed experts and router, which the report names
    kept = json.loads((converted / "config.json").read_text())["quantization_config"]["types"]
    tensors = [t.name for t in GGUFReader(gguf).tensors if t.name.startswith("blk.") and len(t.shape) >= 2]
    linear = [t for t in tensors if not EXPERT_SIDE.search(t)]
    assert len([module for module in kept if ".layers." in module]) == len(linear) > 0, (sorted(kept), linear)
    experts = len(tensors) > len(linear)
    assert experts == ("routed experts and router dequantized" in decisions["model.source"]["reason"]), tensors
    result = compare(served, llama_cpp.logprobs(gguf, [s.prompt + s.tokens for s in served]), BLOCKS_TIE, 0.0)
    print(f"\nthe engine on {gguf.name}'s blocks against llama.cpp: {result}")
    assert result.top1_equal + result.near_ties == result.greedy == GREEDY * len(TEXTS), result
    assert result.passes(BLOCKS_MAX_DIFF, BLOCKS_MEAN_DIFF), result
