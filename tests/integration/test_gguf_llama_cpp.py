"""Every GGUF architecture the service serves (service/policy/gguf_architectures.CHECKED) answers as llama.cpp does on
the same file. The file is a tiny random-weight model of that architecture written by llama.cpp's own converter
(convert_hf_to_gguf.py: its tensor edits, its metadata, a byte-level BPE or a SentencePiece tokenizer), so the service reads what users'
files hold, not what the tests' own writer (tests/support/gguf_models.py) thinks they hold. The service converts it as
it converts any file; its tokenizer and its weights, computed in fp32 by the architecture's transformers model, are
checked against llama.cpp's tokenizer and forward on the file (tests/support/llama_cpp.py). The engine's own path is
checked against llama.cpp on the default model's real file in test_real_model_quality.py."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from service.facts.model import inspect_model
from service.facts.software import read_software
from service.models.gguf_convert import ensure_converted
from service.policy.gguf.gguf_architectures import CHECKED
from service.policy.gguf.model_source import plan_model_source
from tests.integration.test_reference import TEXTS
from tests.support import llama_cpp
from tests.support.reference import Served, compare
from tests.support.server import MODELS

VERSION = "v1"  # bump when the recipe changes, so cached files rebuild
GREEDY = 24  # continuation tokens per text: with the prompts', a few dozen positions each
# fp32 against fp32 (llama.cpp with an fp32 KV cache, no flash attention): summation order only. Measured on a Zen 4
# guest (2026-12-04): logprob max 1.0e-05, mean 2.1e-06 at most over the architectures, against max 2.1-6.7 and mean
# 0.62-1.9 with layer 0's norm off by one (the control below).
MAX_DIFF, MEAN_DIFF, TIE = 1e-3, 1e-4, 1e-3
# llama.cpp's BPE pre-tokenizer whose split rules the demo tokenizer's byte-level splitting (GPT-2's) follows.
PRE = "gpt-2"


@dataclass(frozen=True)
class Case:
    architecture: str  # general.architecture
    config: str  # transformers config class: the converter's input, with the architecture's own traits
    tokenizer: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece, as Llama 2, Mistral 7B)
    tied: bool = True
    config_extra: tuple[tuple[str, Any], ...] = ()  # more of the transformers config
    max_diff: float = MAX_DIFF
    mean_diff: float = MEAN_DIFF


# Llama 3.1's rope scaling with an original context of 64 tokens instead of 8192, so that the scaled dimensions turn
# within the tests' few dozen positions.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 10000.0,
}
_LONGROPE_FACTORS = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.1 * i for i in range(32)],
    "long_factor": [2.0 + 0.2 * i for i in range(32)],
    "original_max_position_embeddings": 1024,
}
_LONGROPE = (("max_position_embeddings", 8192), ("rope_scaling", _LONGROPE_FACTORS))
_EXPERTS = (("num_experts", 4), ("num_experts_per_tok", 2), ("moe_intermediate_size", 128))
_SHARED_EXPERT = (("shared_expert_intermediate_size", 256),)
_NORMALISED = (("norm_topk_prob", True),)


# Qwen2's q/k/v biases, Qwen3's q/k norms and untied head, llama's Q/K rows that the converter permutes.
CASES = {
    "llama": Case("llama", "LlamaConfig", "gpt2"),
    "llama-spm": Case("llama", "LlamaConfig", "llama"),
    "llama3-rope": Case("llama", "LlamaConfig", "gpt2", config_extra=(("rope_scaling", LLAMA3_ROPE),)),
    "mistral": Case("llama", "MistralConfig", "llama", tied=False),
    "phi3": Case("phi3", "Phi3Config", "llama"),  # q/k/v and gate/up fused
    # Norms stored plus one, soft-capping, sliding window on every other layer; queries scaled by 1/sqrt(head_dim) as
    # in Gemma 2 2B and 9B (transformers' default scalar, 256, is theirs: their head_dim), a short window and soft caps
    # other than the defaults so that the metadata is what counts.
    "gemma2": Case(
        "gemma2",
        "Gemma2Config",
        "llama",
        config_extra=(
            ("query_pre_attn_scalar", 64),
            ("sliding_window", 8),
            ("attn_logit_softcapping", 20.0),
            ("final_logit_softcapping", 10.0),
        ),
        # ggml's GELU reads an fp16 table (GGML_GELU_FP16 in ggml-cpu/vec.h): measured max 2.7e-03, mean 3.4e-04
        max_diff=5e-3,
        mean_diff=1e-3,
    ),
    # q/k norms, five sliding-window layers to one full (its pattern), the sliding layers' own rope base and the full
    # ones' linear rope scaling (Gemma 3 4B-27B), queries scaled by 1/sqrt(head_dim) (Gemma 3 270M-12B).
    "gemma3": Case(
        "gemma3",
        "Gemma3TextConfig",
        "llama",
        config_extra=(
            ("num_hidden_layers", 6),
            ("query_pre_attn_scalar", 64),
            ("sliding_window", 8),
            (
                "rope_parameters",
                {
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
            ),
        ),
        # six layers of ggml's fp16 GELU table: measured max 7.4e-03, mean 9.1e-04 (without the full layers' linear
        # rope scaling: max 1.4 and 5 greedy tokens off)
        max_diff=0.015,
        mean_diff=2e-3,
    ),
    "qwen2": Case("qwen2", "Qwen2Config", "gpt2"),
    # Experts: 2 of 4 per token, renormalised on Qwen3-MoE (as llama.cpp always does there), with a gated shared
    # expert on Qwen2-MoE.
    "qwen2moe": Case("qwen2moe", "Qwen2MoeConfig", "gpt2", tied=False, config_extra=_EXPERTS + _SHARED_EXPERT),
    "qwen3moe": Case("qwen3moe", "Qwen3MoeConfig", "gpt2", tied=False, config_extra=_EXPERTS + _NORMALISED),
    "qwen3": Case("qwen3", "Qwen3Config", "gpt2", tied=False),
}

# Files the service refuses: what their conversion would lose.
REFUSED = {"phi3-longrope": Case("phi3", "Phi3Config", "llama", config_extra=_LONGROPE)}


def _sentencepiece(out: Path) -> int:
    """A small SentencePiece BPE model (byte fallback, as Llama 2's) trained on the demo corpus, as tokenizer.model in
    `out`: what llama.cpp's converter reads for a "llama" vocabulary. Its vocabulary size."""
    import io

    import sentencepiece

    from service.models.demo_model import _corpus

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=1024,
        hard_vocab_limit=False,
        byte_fallback=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(model.getvalue())
    return sentencepiece.SentencePieceProcessor(model_proto=model.getvalue()).vocab_size()


def _hf_checkpoint(case: Case, out: Path) -> None:
    """A 2-layer random model of the case's architecture and tokenizer; its initialisation scaled up (0.1) so that
    its next-token distributions are peaked and a conversion error moves tokens, not only decimals."""
    import transformers

    from service.models.demo_model import build_tokenizer

    if case.tokenizer == "llama":
        vocab = _sentencepiece(out)
    else:
        build_tokenizer(out)
        vocab = 2048
    settings: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        initializer_range=0.1,
        tie_word_embeddings=case.tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    config = getattr(transformers, case.config)(**{**settings, **dict(case.config_extra)})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # norms away from 1, so a norm stored with an offset changes the answers
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
    model.save_pretrained(out)


def llama_cpp_file(name: str) -> Path:
    """`MODELS/gguf/llama-cpp-<case>-<version>.gguf`, written once by llama.cpp's converter."""
    path = MODELS / "gguf" / f"llama-cpp-{name}-{VERSION}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as staging:
            _hf_checkpoint({**CASES, **REFUSED}[name], Path(staging) / "hf")
            written = llama_cpp.convert(Path(staging) / "hf", Path(staging) / path.name, PRE)
            os.replace(written, path)  # whole or absent, for a session killed mid-way
    return path


def llama_cpp_quantized(name: str, ftype: str) -> Path:
    """`llama_cpp_file(name)` quantized by llama.cpp's quantizer, every 2-D tensor in `ftype` (`--pure`)."""
    path = MODELS / "gguf" / f"llama-cpp-{name}-{ftype}-{VERSION}.gguf"
    if not path.is_file():
        with tempfile.TemporaryDirectory(dir=path.parent) as staging:
            written = llama_cpp.quantize(llama_cpp_file(name), Path(staging) / path.name, ftype)
            os.replace(written, path)
    return path


def _converted(gguf: Path) -> Path:
    plan = plan_model_source(inspect_model(str(gguf)), "float32", MODELS, read_software(), frozenset())
    assert not plan.result.errors, plan.result.errors
    return ensure_converted(plan.conversion)


def _served(model_dir: Path, prompts: list[list[int]], tokens: list[tuple[int, ...]] | None = None, corrupt=None):
    """The converted model in fp32: each prompt's greedy continuation (or the given `tokens`, teacher-forced) and
    every position's logprob, as the service's answers are recorded (tests/support/reference.Served)."""
    from transformers import AutoModelForCausalLM

    # eager: transformers' sdpa attention leaves out Gemma 2's attention soft-capping
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    served = []
    with torch.no_grad():
        if corrupt is not None:
            corrupt(model)
        for i, prompt in enumerate(prompts):
            sequence = list(prompt) + list(tokens[i] if tokens else ())
            while len(sequence) < len(prompt) + GREEDY:
                sequence.append(int(model(torch.tensor([sequence])).logits[0, -1].argmax()))
            rows = torch.log_softmax(model(torch.tensor([sequence])).logits[0].double(), dim=-1)
            picked = [rows[j, t].item() for j, t in enumerate(sequence[1:])]
            n = len(prompt)
            served.append(Served(tuple(prompt), tuple(picked[: n - 1]), tuple(sequence[n:]), tuple(picked[n - 1 :])))
    return served


def _norm_plus_one(model) -> None:
    """Gemma's trap: a norm stored as w - 1 (or read without the + 1) in layer 0."""
    model.model.layers[0].input_layernorm.weight.add_(1.0)


@pytest.fixture(scope="module", params=sorted(CASES))
def checked(request):
    gguf = llama_cpp_file(request.param)
    converted = _converted(gguf)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    return CASES[request.param], gguf, converted, tokenizer


def test_every_served_architecture_has_a_llama_cpp_check():
    unchecked = set(CHECKED) - {case.architecture for case in CASES.values()}
    assert not unchecked, f"served but not checked against llama.cpp: {unchecked}"


def test_the_file_is_llama_cpps_own(checked):
    from gguf import GGUFReader

    case, gguf, _, _ = checked
    fields = GGUFReader(gguf).fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == case.architecture
    assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == case.tokenizer


def test_the_tokens_are_llama_cpps(checked):
    _, gguf, _, tokenizer = checked
    texts = [*TEXTS, "Numbers 12345 and   spaces,\tpunctuation!? and 'quotes' don't", "<|im_start|>user\nhi"]
    assert [tokenizer(t).input_ids for t in texts] == llama_cpp.tokenize(gguf, texts)


def test_the_answers_are_llama_cpps(checked):
    case, gguf, converted, tokenizer = checked
    served = _served(converted, [tokenizer(t).input_ids for t in TEXTS])
    reference = llama_cpp.logprobs(gguf, [s.prompt + s.tokens for s in served])
    result = compare(served, reference, TIE, 0.0)
    print(f"\n{case}: the service's conversion against llama.cpp on {gguf.name}: {result}")
    assert result.greedy == GREEDY * len(TEXTS) and result.top1_equal == result.greedy, result
    assert result.passes(case.max_diff, case.mean_diff), result
    prompts, tokens = [list(s.prompt) for s in served], [s.tokens for s in served]
    wrong = compare(_served(converted, prompts, tokens, _norm_plus_one), reference, TIE, 0.0)
    print(f"with layer 0's norm off by one: {wrong}")
    assert not wrong.passes(case.max_diff, case.mean_diff), wrong


def test_a_file_whose_rope_factors_the_conversion_loses_is_refused():
    """Phi-3's LongRoPE factors (rope_factors_long/short), which transformers' mapping drops: served, it answered 8 of
    72 greedy tokens as llama.cpp does."""
    gguf = llama_cpp_file("phi3-longrope")
    plan = plan_model_source(inspect_model(str(gguf)), "float32", MODELS, read_software(), frozenset())
    (error,) = plan.result.errors
    assert "LongRoPE factors (rope_factors_long.weight, rope_factors_short.weight)" in error, error


@pytest.mark.engine
def test_the_engine_answers_a_llama_3_rope_file_as_llama_cpp_does(server_logs):
    """The file kind most llama users have (Llama 3.x: rope_freqs), through the real engine: vLLM's own model on the
    converted copy (LongRoPE factors), served in fp32. Measured on a Zen 4 guest (2026-12-04): 72 of 72 greedy tokens,
    logprob max 1.5e-05."""
    import httpx
    from openai import OpenAI

    from tests.integration.conftest import _start
    from tests.support.reference import prompt_ids, query
    from tests.support.release import release

    gguf = llama_cpp_file("llama3-rope")
    server = _start("gguf-llama3-rope", server_logs, gguf.stem, model=str(gguf), kv_cache_gib="0.25", dtype="float32")
    try:
        report = httpx.get(f"{server.url}/v1/hardware", timeout=30).json()
        decisions = {d["setting"]: d for d in report["decisions"]}
        assert decisions["model.gguf_rope"]["value"] == "rope_freqs as LongRoPE factors"
        converted = Path(decisions["model.source"]["value"])
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        served = [query(client, gguf.stem, ids, GREEDY) for ids in prompt_ids(converted, TEXTS)]
    finally:
        release(server.process)
    result = compare(served, llama_cpp.logprobs(gguf, [s.prompt + s.tokens for s in served]), TIE, 0.0)
    print(f"\nthe engine on {gguf.name} against llama.cpp: {result}")
    assert result.top1_equal == result.greedy == GREEDY * len(TEXTS), result
    assert result.passes(MAX_DIFF, MEAN_DIFF), result
