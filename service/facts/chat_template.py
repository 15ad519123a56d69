"""Model directory -> its chat template and added tokens, and which known format markers they carry.

Read from the files a Hugging Face tokenizer saves (no tokenizer is loaded): chat_template.jinja (newer
transformers), else tokenizer_config.json `chat_template` (a string, or named templates such as
"default" and "tool_use"); added tokens from tokenizer_config.json `added_tokens_decoder`, else
tokenizer.json `added_tokens`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.facts.json_file import read_json

# Text that identifies a tool-call or reasoning format, in a template or as an added token. Which parser
# each implies is policy (service/policy/engine/chat.py); here they are only looked for.
MARKERS = (
    "<tool_call>",  # Hermes / Qwen2.5 / Qwen3 JSON tool calls
    "<function=",  # Qwen3-Coder XML tool calls inside <tool_call>
    "<think>",
    "</think>",
    "[TOOL_CALLS]",  # Mistral
    "[THINK]",  # Magistral
    "<|python_tag|>",  # Llama 3.1 built-in tools
    "<|start_header_id|>",  # Llama 3.x turns
    "<|header_start|>",  # Llama 4 turns
    '{"name": function name, "parameters"',  # Llama 3.1/3.2 JSON tool-call instruction
    "<｜tool▁calls▁begin｜>",  # DeepSeek V3 / R1
    "<｜Assistant｜>",  # DeepSeek turns
    "<|channel|>",  # gpt-oss harmony
    "<|im_start|>",  # ChatML turns
)


@dataclass(frozen=True)
class ChatTemplateFacts:
    source: str | None  # file the template was read from; None: the model has no chat template
    template_chars: int  # length of all templates the model ships (0: none)
    markers: tuple[str, ...]  # the MARKERS found in the template or among the added tokens, sorted
    special_markers: tuple[str, ...]  # those that are special tokens (hidden from text unless asked for)

    @property
    def has_template(self) -> bool:
        return self.template_chars > 0


def _read_json(path: Path) -> dict[str, Any]:
    return read_json(path) if path.is_file() else {}


def _template_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        return "\n".join(str(t.get("template", "")) for t in value if isinstance(t, dict))
    return ""


def _template(directory: Path, tokenizer_config: dict[str, Any]) -> tuple[str | None, str]:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.name, jinja.read_text()
    text = _template_text(tokenizer_config.get("chat_template"))
    if text:
        return "tokenizer_config.json", text
    text = _template_text(_read_json(directory / "chat_template.json").get("chat_template"))
    return ("chat_template.json", text) if text else (None, "")


def _added_tokens(directory: Path, tokenizer_config: dict[str, Any]) -> list[dict[str, Any]]:
    decoder = tokenizer_config.get("added_tokens_decoder")
    if isinstance(decoder, dict) and decoder:
        return [t for t in decoder.values() if isinstance(t, dict)]
    tokens = _read_json(directory / "tokenizer.json").get("added_tokens")
    return [t for t in tokens if isinstance(t, dict)] if isinstance(tokens, list) else []


def read_chat_template(directory: Path, template_file: Path | None = None) -> ChatTemplateFacts:
    """The model's template, or `template_file` in its place (the chat_template setting), with the model's tokens."""
    tokenizer_config = _read_json(directory / "tokenizer_config.json")
    source, template = read_template_file(template_file) if template_file else _template(directory, tokenizer_config)
    tokens = _added_tokens(directory, tokenizer_config)
    added = [(str(t.get("content", "")), bool(t.get("special"))) for t in tokens]
    return chat_template_facts(source, template, added)


def read_template_file(path: Path) -> tuple[str, str]:
    """(its absolute path, its text) of a chat template file; ValueError naming what is wrong with it."""
    path = path.expanduser().absolute()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"chat_template {path} cannot be read: {reason}") from None
    if not text.strip():
        raise ValueError(f"chat_template {path} is empty")
    return str(path), text


def chat_template_facts(
    source: str | None, template: str, added_tokens: Iterable[tuple[str, bool]]
) -> ChatTemplateFacts:
    """From a template's text and the (content, special) of the added tokens, wherever they were read."""
    tokens = list(added_tokens)
    added = {content for content, _ in tokens}
    special = {content for content, is_special in tokens if is_special}
    markers = sorted(m for m in MARKERS if m in template or m in added)
    return ChatTemplateFacts(source, len(template), tuple(markers), tuple(m for m in markers if m in special))
