"""vLLM tool-call parser `forced_only`, for chat models with no tool-call format vLLM knows: named and
`required` tool_choice work, `auto` answers in text.

Loaded by path like any `--tool-parser-plugin` (vLLM imports the file, the decorator registers the name).

Why a parser at all: vLLM 0.32 answers `tool_choice="required"` or a named function with 400 "requires
--tool-call-parser to be set" unless a tool parser is configured (vllm/renderers/online_renderer.py
`render_chat`), and it configures one only together with auto tool choice (vllm/parser/parser_manager.py
`get_tool_parser`). For a parser with `supports_required_and_named` and no structural tag, vLLM forces the
call itself, whatever the model: the tools' JSON schema becomes the request's grammar
(`ToolParser.adjust_request`) and the forced JSON is turned into `tool_calls` by its generic path
(`DelegatingParser._extract_tool_calls`). This parser adds nothing else: it never finds a call in free text,
since the model has no format to write one in.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.entrypoints.generate.base.protocol import DeltaMessage, ExtractedToolCallInformation
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

NAME = "forced_only"


@ToolParserManager.register_module(NAME)
class ForcedOnlyToolParser(ToolParser):
    supports_required_and_named = True
    structural_tag_model = None

    def extract_tool_calls(self, model_output: str, request: ChatCompletionRequest) -> ExtractedToolCallInformation:
        return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        return DeltaMessage(content=delta_text) if delta_text else None
