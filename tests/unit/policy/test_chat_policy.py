"""Tool-call and reasoning parsers from a model's chat template and added tokens (facts -> policy)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.facts.chat_template import read_chat_template
from service.facts.model import inspect_model
from service.facts.vllm_source import read_vllm_names
from service.policy.engine.chat import (
    FORCED_ONLY,
    FORCED_ONLY_PLUGIN,
    REASONING_FORMATS,
    TOOL_FORMATS,
    chat_decisions,
    unknown_parser_errors,
)
from service.settings import Settings
from tests.support.chat_templates import LLAMA31_SPECIAL, LLAMA31_TEMPLATE, QWEN3_ADDED, QWEN3_SPECIAL, QWEN3_TEMPLATE

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "models"
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def model_dir(tmp_path: Path, template: str | list | None, special=(), added=(), fixture="llama-3.1-8b-instruct"):
    """A model directory: a recorded config.json plus a tokenizer_config.json as transformers saves it."""
    shutil.copy(FIXTURES / fixture / "config.json", tmp_path / "config.json")
    tokens = [(t, True) for t in special] + [(t, False) for t in added]
    config = {"added_tokens_decoder": {str(100 + i): {"content": t, "special": s} for i, (t, s) in enumerate(tokens)}}
    if template is not None:
        config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def decided(tmp_path, template, special=(), added=(), **settings) -> dict[str, object]:
    model = inspect_model(str(model_dir(tmp_path, template, special, added)))
    return {d.setting: d.value for d in chat_decisions(model, Settings(**settings)).decisions}


def test_qwen3_template_gets_hermes_tools_and_qwen3_reasoning(tmp_path):
    got = decided(tmp_path, QWEN3_TEMPLATE, QWEN3_SPECIAL, QWEN3_ADDED)
    assert got == {
        "engine.tool_call_parser": "hermes",
        "engine.enable_auto_tool_choice": True,
        "engine.reasoning_parser": "qwen3",
    }


def test_qwen25_style_tool_calls_without_thinking(tmp_path):
    template = QWEN3_TEMPLATE.replace("<think>", "").replace("</think>", "")
    got = decided(tmp_path, template, QWEN3_SPECIAL, ["<tool_call>", "</tool_call>"])
    assert got["engine.tool_call_parser"] == "hermes" and got["engine.reasoning_parser"] is None


def test_llama31_template_gets_llama3_json(tmp_path):
    got = decided(tmp_path, LLAMA31_TEMPLATE, LLAMA31_SPECIAL)
    assert got["engine.tool_call_parser"] == "llama3_json" and got["engine.reasoning_parser"] is None


@pytest.mark.parametrize(
    "template,special,tool,reasoning",
    [
        ("{{ '[AVAILABLE_TOOLS]' }}[TOOL_CALLS]", ["[TOOL_CALLS]", "[THINK]"], "mistral", "mistral"),
        (
            "<｜Assistant｜><think>\n{{ x }}</think>",
            ["<｜tool▁calls▁begin｜>", "<｜Assistant｜>"],
            "deepseek_v3",
            "deepseek_r1",
        ),
        ("<|start|>assistant<|channel|>analysis<|message|>", ["<|channel|>"], "openai", "openai_gptoss"),
        ("<tool_call>\n<function={{ name }}>", ["<tool_call>"], "qwen3_xml", None),
    ],
    ids=["mistral", "deepseek-r1", "gpt-oss", "qwen3-coder"],
)
def test_other_families(tmp_path, template, special, tool, reasoning):
    got = decided(tmp_path, template, special)
    assert (got["engine.tool_call_parser"], got["engine.reasoning_parser"]) == (tool, reasoning)


def test_unknown_format_gets_named_and_required_only_with_the_reason(tmp_path):
    model = inspect_model(str(model_dir(tmp_path, CHATML, ["<|im_start|>", "<|im_end|>"])))
    decisions = {d.setting: d for d in chat_decisions(model, Settings()).decisions}
    tool = decisions["engine.tool_call_parser"]
    assert tool.value == FORCED_ONLY and tool.source == "policy"
    assert "named and required tool_choice only" in tool.reason and "auto" in tool.reason
    assert decisions["engine.tool_parser_plugin"].value == FORCED_ONLY_PLUGIN
    assert decisions["engine.enable_auto_tool_choice"].value is True


def test_named_templates_are_all_read(tmp_path):
    """tokenizer_config.json may hold named templates; the tool_use one carries the tool markers."""
    templates = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": QWEN3_TEMPLATE}]
    facts = read_chat_template(model_dir(tmp_path, templates))
    assert "<tool_call>" in facts.markers and facts.source == "tokenizer_config.json"


def test_template_file_wins_and_added_tokens_come_from_tokenizer_json(tmp_path):
    (tmp_path / "chat_template.jinja").write_text(LLAMA31_TEMPLATE)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"added_tokens": [{"id": 5, "content": "<|python_tag|>", "special": True}]})
    )
    facts = read_chat_template(tmp_path)
    assert facts.source == "chat_template.jinja" and "<|im_start|>" not in facts.markers
    assert "<|start_header_id|>" in facts.markers and facts.special_markers == ("<|python_tag|>",)


def test_no_chat_template_sets_no_parser_and_says_why(tmp_path):
    model = inspect_model(str(model_dir(tmp_path, None)))
    tool = chat_decisions(model, Settings()).decisions[0]
    assert tool.value is None and "no chat template" in tool.reason


def test_user_settings_win(tmp_path):
    got = decided(
        tmp_path, QWEN3_TEMPLATE, QWEN3_SPECIAL, QWEN3_ADDED, tool_call_parser="qwen3_xml", reasoning_parser="none"
    )
    assert got["engine.tool_call_parser"] == "qwen3_xml" and got["engine.reasoning_parser"] is None
    model = inspect_model(str(model_dir(tmp_path, QWEN3_TEMPLATE, QWEN3_SPECIAL, QWEN3_ADDED)))
    sources = {d.setting: d.source for d in chat_decisions(model, Settings(tool_call_parser="none")).decisions}
    assert sources["engine.tool_call_parser"] == "user" and "engine.enable_auto_tool_choice" not in sources


def test_the_users_template_file_replaces_the_models_and_decides_the_parsers(tmp_path):
    """A base model (no template) given a Qwen3-style one: the parsers come from the file, the markers that are the
    model's own tokens from its tokenizer, and vLLM is handed the file by its absolute path."""
    (tmp_path / "model").mkdir()
    model_path = str(model_dir(tmp_path / "model", None, QWEN3_SPECIAL, QWEN3_ADDED))
    template = tmp_path / "qwen3.jinja"
    template.write_text(QWEN3_TEMPLATE)
    model = inspect_model(model_path, chat_template=template)
    assert model.chat_template.source == str(template) and model.chat_template.has_template
    result = chat_decisions(model, Settings(chat_template=template))
    got = {d.setting: (d.value, d.source) for d in result.decisions}
    assert got["engine.chat_template"] == (str(template), "user")
    assert got["engine.tool_call_parser"] == ("hermes", "policy")
    assert got["engine.reasoning_parser"] == ("qwen3", "policy")
    # Without the setting, the same model has no template, and the parsers say so.
    plain = {d.setting: d.value for d in chat_decisions(inspect_model(model_path), Settings()).decisions}
    assert "engine.chat_template" not in plain and plain["engine.tool_call_parser"] is None


@pytest.mark.parametrize("content", [None, "", "\xff\xfe"])
def test_a_template_file_that_cannot_serve_is_refused_naming_it(tmp_path, content):
    path = tmp_path / "template.jinja"
    if content is not None:
        path.write_bytes(content.encode("latin-1"))
    with pytest.raises(ValueError, match=f"chat_template {path} "):
        inspect_model(str(model_dir(tmp_path, CHATML)), chat_template=path)


def test_pooling_models_get_no_chat_decisions():
    model = inspect_model(str(FIXTURES / "bge-small-en-v1.5"))
    assert chat_decisions(model, Settings()).decisions == ()


@pytest.mark.parametrize("field,value", [("tool_call_parser", "hermes2"), ("reasoning_parser", "hermes")])
def test_the_policy_refuses_names_vllm_does_not_register(field, value):
    (error,) = unknown_parser_errors(Settings(**{field: value}))
    assert error.startswith(f"{field}={value!r} is not a parser vLLM knows")
    assert unknown_parser_errors(Settings(tool_call_parser="hermes", reasoning_parser="qwen3")) == []


def test_every_policy_parser_is_registered_in_the_installed_vllm():
    names = read_vllm_names()
    assert {f.parser for f in TOOL_FORMATS} <= names.tool_parsers
    assert {f.parser for f in REASONING_FORMATS} <= names.reasoning_parsers
    assert FORCED_ONLY not in names.tool_parsers  # the service's own, registered by its plugin module


def test_model_facts_carry_vocab_and_multimodality():
    text = inspect_model(str(FIXTURES / "llama-3.1-8b-instruct"))
    assert text.vocab_size == 128256 and not text.is_multimodal
    assert inspect_model(str(FIXTURES / "qwen3.5-397b-a17b")).is_multimodal
