"""Tiny random-weight models built offline with the demo model's recipe (tokenizer + config)."""

from __future__ import annotations

from pathlib import Path

from service.models.demo_model import build_model, save_random_model


def _qwen3_next_weights(directory: Path) -> None:
    save_random_model(
        directory,
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        max_position_embeddings=2048,
    )


def tiny_qwen3_next(cache_dir: Path) -> Path:
    """A hybrid Gated-DeltaNet model (linear_attention / full_attention layers), about 10 MB."""
    return build_model(cache_dir / "models" / "tiny-qwen3-next-v2", build_weights=_qwen3_next_weights)


def _qwen3_next_unequal_gdn_weights(directory: Path) -> None:
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    _qwen3_next_weights(directory)  # the recipe above, then value heads twice as wide as the key heads
    config = Qwen3NextConfig.from_pretrained(directory)
    config.linear_value_head_dim = 128
    torch.manual_seed(0)
    Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)


def tiny_qwen3_next_unequal_gdn_heads(cache_dir: Path) -> Path:
    """The hybrid model with linear_key_head_dim 64 != linear_value_head_dim 128: transformers runs it, vLLM 0.32's
    CPU GDN prefill kernel does not (a kernel limit the pre-flight check refuses)."""
    return build_model(
        cache_dir / "models" / "tiny-qwen3-next-gdn-k64-v128", build_weights=_qwen3_next_unequal_gdn_weights
    )


# ---------------------------------------------------------------------------------------------------------
# Chat models in real formats (tests/support/chat_templates.py)
# ---------------------------------------------------------------------------------------------------------

# What the scripted Qwen3-style model says, one added token per piece: reasoning, then either a tool call or,
# with <tool_call> banned (logit_bias), a text answer. Distinct pieces, since each token has one successor.
SCRIPT_REASONING = "The user asks for the weather, so I call the tool."
SCRIPT_CALL = ['{"name": "get_weather", ', '"arguments": {', '"city": "Paris"', "}}"]
SCRIPT_ANSWER = "It is sunny in Paris."


def _dress_tokenizer(directory: Path, template: str, special: list[str], added: list[str], eos: str):
    """The demo tokenizer with a family's chat template and its added tokens."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    tok.add_special_tokens({"additional_special_tokens": special})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tok.eos_token = eos
    tok.chat_template = template
    tok.save_pretrained(directory)
    return tok


def _scripted_qwen3_weights(directory: Path) -> None:
    """Random weights never write <think> or <tool_call>; this model writes
    `<think>REASONING</think><tool_call>CALL</tool_call>` after the generation prompt."""
    from tests.support.chat_templates import QWEN3_ADDED, QWEN3_SPECIAL, QWEN3_TEMPLATE

    tok = _dress_tokenizer(
        directory,
        QWEN3_TEMPLATE,
        QWEN3_SPECIAL,
        QWEN3_ADDED + [SCRIPT_REASONING, *SCRIPT_CALL, SCRIPT_ANSWER],
        eos="<|im_end|>",
    )
    ids = {
        t: tok.convert_tokens_to_ids(t)
        for t in [*QWEN3_SPECIAL, *QWEN3_ADDED, SCRIPT_REASONING, *SCRIPT_CALL, SCRIPT_ANSWER]
    }
    newline = tok.encode("\n", add_special_tokens=False)[-1]  # the generation prompt ends with it
    # token -> [(successor, logit scale)]: after </think> a tool call first, the text answer second.
    chain = [
        newline,
        ids["<think>"],
        ids[SCRIPT_REASONING],
        ids["</think>"],
        ids["<tool_call>"],
        *[ids[p] for p in SCRIPT_CALL],
        ids["</tool_call>"],
    ]
    successors = {a: [(b, 3.0)] for a, b in zip(chain, chain[1:])}
    successors[ids["</think>"]].append((ids[SCRIPT_ANSWER], 2.0))
    successors[ids["</tool_call>"]] = [(ids["<|im_end|>"], 3.0)]
    successors[ids[SCRIPT_ANSWER]] = [(ids["<|im_end|>"], 3.0)]
    _save_scripted_qwen3(directory, len(tok), ids, successors, max_position_embeddings=2048)


def _save_scripted_qwen3(
    directory: Path,
    tokens: int,
    ids: dict[str, int],
    successors: dict[int, list[tuple[int, float]]],
    max_position_embeddings: int,
) -> None:
    """Qwen3 architecture whose next token depends only on the current one (`successors`: token -> [(successor,
    logit scale)]): attention and MLP outputs are zero, so the last hidden state is the current token's embedding;
    scripted tokens get orthogonal embeddings and the LM head maps each to its successor."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden = 64
    vocab = (tokens + 63) // 64 * 64
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=ids["<|im_start|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|im_end|>"],
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed[:, : len(successors)] = 0  # only scripted tokens point along the first dimensions
        head.normal_(0.0, 0.02)
        for dim, (token, nexts) in enumerate(successors.items()):
            embed[token] = 0
            embed[token, dim] = 1.0  # RMSNorm turns it into sqrt(hidden) = 8 along `dim`
            for successor, scale in nexts:
                head[successor, dim] = scale  # logit 8 * scale, far above the random ones
    model.to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)


def tiny_qwen3_chat(cache_dir: Path) -> Path:
    """Qwen3-style chat model (Qwen3ForCausalLM, Qwen3 template, <think> and <tool_call> added tokens) whose
    weights write a scripted reasoning + tool call; about 1 MB."""
    return build_model(cache_dir / "models" / "tiny-qwen3-chat-v1", build_weights=_scripted_qwen3_weights)


# What the agent model says to any prompt: a thought, then a text answer (neither Claude Code nor Codex has the
# chat model's get_weather tool, so a call to it would end no turn of theirs).
AGENT_REASONING = "The user asks a question; I answer it."
AGENT_ANSWER = "Paris is the capital of France."
# Its context, served whole: it holds Claude Code 2.1.332's prompt (29.8k tokens in the demo tokenizer's small
# vocabulary) and Codex CLI 0.171.0's (23.8k) with room for more turns (tests/integration/test_agent_clients.py prints
# them), but not Claude Code's 32,000-token output budget beside its prompt, as most served contexts do not.
AGENT_CONTEXT = 49152


def _scripted_qwen3_agent_weights(directory: Path) -> None:
    """`<think>AGENT_REASONING</think>AGENT_ANSWER` after the generation prompt, tools or not."""
    from tests.support.chat_templates import QWEN3_ADDED, QWEN3_SPECIAL, QWEN3_TEMPLATE

    tok = _dress_tokenizer(
        directory, QWEN3_TEMPLATE, QWEN3_SPECIAL, QWEN3_ADDED + [AGENT_REASONING, AGENT_ANSWER], eos="<|im_end|>"
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in [*QWEN3_SPECIAL, *QWEN3_ADDED, AGENT_REASONING, AGENT_ANSWER]}
    newline = tok.encode("\n", add_special_tokens=False)[-1]  # the generation prompt ends with it
    chain = [newline, ids["<think>"], ids[AGENT_REASONING], ids["</think>"], ids[AGENT_ANSWER], ids["<|im_end|>"]]
    successors = {a: [(b, 3.0)] for a, b in zip(chain, chain[1:])}
    _save_scripted_qwen3(directory, len(tok), ids, successors, max_position_embeddings=AGENT_CONTEXT)


def tiny_qwen3_agent(cache_dir: Path) -> Path:
    """The scripted Qwen3-style model with a context that holds the agent clients' prompts, answering in text."""
    return build_model(cache_dir / "models" / "tiny-qwen3-agent-v1", build_weights=_scripted_qwen3_agent_weights)


def _llama31_weights(directory: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.support.chat_templates import LLAMA31_SPECIAL, LLAMA31_TEMPLATE

    tok = _dress_tokenizer(directory, LLAMA31_TEMPLATE, LLAMA31_SPECIAL, [], eos="<|eot_id|>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=(len(tok) + 63) // 64 * 64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.convert_tokens_to_ids("<|begin_of_text|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|eot_id|>"),
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)


def tiny_llama31_chat(cache_dir: Path) -> Path:
    """Llama 3.1-style chat model (Llama 3.1 template and special tokens), random weights; about 1 MB."""
    return build_model(cache_dir / "models" / "tiny-llama31-chat-v1", build_weights=_llama31_weights)
