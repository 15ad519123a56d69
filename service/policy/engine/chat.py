"""Tool-call and reasoning parsers for a chat model: from the markers its chat template and added tokens carry.

vLLM parses a model's tool calls and thinking only with a parser named for the model's format
(`--tool-call-parser`, `--reasoning-parser`); it never guesses. The service does: a table of formats, first
match wins, each row the markers that identify it. A setting ("auto" | "none" | a vLLM name) overrides.
Named and `required` tool_choice work on every chat model: they are grammar-forced, and a model with no
known format gets the service's `forced_only` parser (service/in_vllm/forced_tool_parser.py), which serves them and
leaves `auto` to answer in text.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.facts.chat_template import ChatTemplateFacts
from service.facts.model import ModelFacts
from service.facts.vllm_source import read_vllm_names
from service.policy.plan.decision import Decision, PolicyResult, Source, engine
from service.settings import Settings

FORCED_ONLY = "forced_only"
FORCED_ONLY_PLUGIN = "service.in_vllm.forced_tool_parser"  # imported by vLLM's --tool-parser-plugin mechanism


@dataclass(frozen=True)
class Format:
    markers: frozenset[str]  # all must be present in the template or among the added tokens
    parser: str  # vLLM 0.32 registry name
    label: str


def _f(markers: set[str], parser: str, label: str) -> Format:
    return Format(frozenset(markers), parser, label)


# Most specific first. Every parser name is checked against vLLM's registry by tests/unit/policy/test_chat_policy.py.
TOOL_FORMATS = (
    _f({"<|channel|>"}, "openai", "gpt-oss harmony channels"),
    _f({"<tool_call>", "<function="}, "qwen3_xml", "Qwen3-Coder XML <function=...> inside <tool_call>"),
    _f({"<tool_call>"}, "hermes", "Hermes-style <tool_call> JSON (Qwen2.5, Qwen3, QwQ, Hermes)"),
    _f({"[TOOL_CALLS]"}, "mistral", "Mistral [TOOL_CALLS]"),
    _f({"<｜tool▁calls▁begin｜>"}, "deepseek_v3", "DeepSeek V3 / R1 tool-call tokens"),
    _f({"<|start_header_id|>", '{"name": function name, "parameters"'}, "llama3_json", "Llama 3.1/3.2 JSON tool calls"),
)

REASONING_FORMATS = (
    _f({"<|channel|>"}, "openai_gptoss", "gpt-oss analysis channel"),
    _f({"[THINK]"}, "mistral", "Magistral [THINK] ... [/THINK]"),
    _f({"<think>", "</think>", "<｜Assistant｜>"}, "deepseek_r1", "DeepSeek-R1 <think> (the prompt may open it)"),
    _f({"<think>", "</think>", "<|im_start|>"}, "qwen3", "Qwen3 / QwQ <think> ... </think> in ChatML"),
)


def _match(formats: tuple[Format, ...], template: ChatTemplateFacts) -> Format | None:
    return next((f for f in formats if f.markers <= set(template.markers)), None)


def _found(fmt: Format) -> str:
    return f"{fmt.label}: the chat template / added tokens carry {', '.join(sorted(fmt.markers))}"


def unknown_parser_errors(settings: Settings) -> list[str]:
    """A parser the user named that the installed vLLM does not register (vLLM's registry is read only then)."""
    named = {f: getattr(settings, f) for f in ("tool_call_parser", "reasoning_parser")}
    named = {f: v for f, v in named.items() if v not in ("auto", "none")}
    if not named:
        return []
    names = read_vllm_names()
    known = {"tool_call_parser": names.tool_parsers | {FORCED_ONLY}, "reasoning_parser": names.reasoning_parsers}
    return [
        f"{field}={value!r} is not a parser vLLM knows; one of auto, none, {', '.join(sorted(known[field]))}"
        for field, value in named.items()
        if value not in known[field]
    ]


def chat_decisions(model: ModelFacts, settings: Settings) -> PolicyResult:
    """Engine arguments for tool calling and reasoning (none for pooling models), and parsers vLLM lacks."""
    errors = unknown_parser_errors(settings)
    template = model.chat_template
    chosen = [] if template is None or settings.chat_template is None else [_template_decision(template)]
    if model.is_embedding or template is None:
        return PolicyResult.of(*chosen, errors=errors)
    decisions = [
        *chosen,
        *_tool_decisions(template, settings.tool_call_parser),
        _reasoning_decision(template, settings.reasoning_parser),
    ]
    return PolicyResult.of(*decisions, errors=errors)


def _template_decision(template: ChatTemplateFacts) -> Decision:
    """The user's template file (its absolute path, as the model facts read it), for vLLM's --chat-template."""
    return engine(
        "chat_template",
        template.source,
        "set by the user: served instead of the model's own; the tool-call and reasoning parsers are chosen from it",
        "user",
    )


def _tool_decisions(template: ChatTemplateFacts, setting: str) -> list[Decision]:
    if setting == "none":
        return [engine("tool_call_parser", None, "turned off by the user: every tool_choice but none is a 400", "user")]
    if not template.has_template:
        return [
            engine(
                "tool_call_parser",
                None,
                "the model has no chat template: /v1/chat/completions cannot serve it",
                "policy",
            )
        ]
    source: Source
    if setting != "auto":
        parser, reason, source = setting, "set by the user", "user"
    elif (fmt := _match(TOOL_FORMATS, template)) is not None:
        parser, reason, source = fmt.parser, _found(fmt) + "; tool_choice auto, required and named all work", "policy"
    else:
        parser, source = FORCED_ONLY, "policy"
        reason = (
            "no tool-call format vLLM knows in the chat template: named and required tool_choice only "
            "(grammar-forced JSON arguments); with tool_choice auto the model answers in text"
        )
    decisions = [
        engine("tool_call_parser", parser, reason, source),
        engine(
            "enable_auto_tool_choice",
            True,
            "vLLM sets up a tool parser only with auto tool choice on; without one, every tool_choice but none is a 400",
            source,
        ),
    ]
    if parser == FORCED_ONLY:
        decisions.append(
            engine("tool_parser_plugin", FORCED_ONLY_PLUGIN, "registers the forced_only tool parser", source)
        )
    return decisions


def _reasoning_decision(template: ChatTemplateFacts, setting: str) -> Decision:
    if setting == "none":
        return engine("reasoning_parser", None, "turned off by the user: thinking stays in content", "user")
    if setting != "auto":
        return engine("reasoning_parser", setting, "set by the user", "user")
    fmt = _match(REASONING_FORMATS, template)
    if fmt is None:
        return engine(
            "reasoning_parser", None, "no reasoning markers in the chat template: not a thinking model", "policy"
        )
    reason = _found(fmt) + "; the thinking goes to message.reasoning, the answer to message.content"
    return engine("reasoning_parser", fmt.parser, reason, "policy")
