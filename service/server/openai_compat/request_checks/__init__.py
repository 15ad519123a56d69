"""Checks of a completion request where OpenAI answers 400 and vLLM 0.32 does not (or does without naming the
field): pure functions of (path, parsed JSON body, model facts) -> the problem, or None.

Only what vLLM lets through is checked here (each case was tried against a running server, see
tests/reliability/test_bad_input.py):
- a role OpenAI does not have ("wizard" was answered 200), a tool message without its tool_call_id (200), a
  user/system/tool message without content or with an empty list of parts (200; null content: 400 with 19
  validation errors), an assistant message with neither content nor tool calls (200);
- a negative top_logprobs (400 naming logprobs and the vocabulary's size), logit_bias values outside OpenAI's
  [-100, 100] (200), `best_of` other than `n` (200: vLLM 0.32 parses the field and ignores it, so the answer was n
  plain samples);
- an image/audio/video part sent to a text-only model (400 without `param`), a JSON schema that is not one (400
  "Grammar error" without `param`);
- token ids outside the vocabulary sent to /detokenize (200 with the ids dropped; /v1/completions refuses them);
- audio output asked for (`modalities` other than text, an `audio` object): 200, text only, the field ignored; so
  was `web_search_options` (OpenAI's search models' option: no search was done);
- presence/frequency penalties outside [-2, 2], an n below 1 and a truncate_prompt_tokens of 0 (400 without
  `param`);
- a string holding a lone UTF-16 surrogate (the JSON escape "\\ud800"): 400 "TextEncodeInput must be ..." from the
  tokenizer, or a 500 when it is a stop string (the engine cannot encode the request);
- content that is an object instead of a list, a content part that is not an object or of a type vLLM's chat parser
  does not take, a text part without its text, an assistant's tool call without its id, type, function name or
  string arguments (400 "validation errors for ValidatorIterator" without `param`: vLLM checks those lists item by
  item, so its errors start at the item; what else it refuses that way is named after the fact, error_fields.py);
- prompt token ids beyond the vocabulary, an empty list of prompts or an empty prompt in one, an empty `messages`
  (400 without `param`); token ids given as booleans (200: true was served as token 1).
- a number or boolean field sent as another JSON type ("max_tokens": "2", "stream": "yes", "temperature": true:
  200, pydantic's lax mode converts them; scalar_fields.py).
vLLM's /v1/chat/completions/batch gets the chat checks for each of its conversations, SageMaker's /invocations those
of the request vLLM serves it as (chat or completion), /v1/responses the surrogate check, a `max_output_tokens`
below 1 (named `max_tokens` by vLLM), an empty `input` list, an image or audio part for a text-only model, a
built-in tool (`web_search`, `file_search`, `mcp`, ...: served without it, as the service runs no tool server) and
its JSON schemas (text format, function tools' parameters), and /tokenize those of
the messages it is sent (clients count a chat request's tokens there before sending it: a request the chat route
refuses is refused there too). Everything else (other types,
unknown tool in tool_choice, stop that is not strings, out-of-vocab logit_bias ids) vLLM already answers with 400
naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.facts.model import ModelFacts
from service.server.openai_compat.request_checks.anthropic import ANTHROPIC_BLOCK_FIELDS as ANTHROPIC_BLOCK_FIELDS
from service.server.openai_compat.request_checks.anthropic import check_anthropic_messages
from service.server.openai_compat.request_checks.chat import (
    check_conversations,
    check_messages,
    check_no_messages,
    check_output_modalities,
    check_response_format,
    check_tools,
    check_web_search,
)
from service.server.openai_compat.request_checks.common import (
    SURROGATE_BYTES,
    RequestProblem,
    check_best_of,
    check_logit_bias,
    check_lone_surrogate,
    check_sampling_ranges,
    check_scalar_type,
    check_top_logprobs,
)
from service.server.openai_compat.request_checks.completions import (
    check_empty_prompt,
    check_prompt_ids,
    check_token_ids,
)
from service.server.openai_compat.request_checks.responses import RESPONSES_TOOLS as RESPONSES_TOOLS
from service.server.openai_compat.request_checks.responses import check_responses

__all__ = ["RequestProblem", "check_request", "served_as"]

CHAT = "/v1/chat/completions"


COMPLETIONS = "/v1/completions"


CHAT_BATCH = "/v1/chat/completions/batch"  # vLLM's: a list of conversations, one choice each


DETOKENIZE = "/detokenize"


TOKENIZE = "/tokenize"  # vLLM's: a prompt, or chat messages rendered by the chat template


INVOCATIONS = "/invocations"  # SageMaker's: vLLM serves a body with messages as a chat request, else as a completion


RESPONSES = "/v1/responses"  # its input is not chat messages: its strings, its output limit and its JSON schemas


MESSAGES, COUNT_TOKENS = "/v1/messages", "/v1/messages/count_tokens"  # Anthropic's: its roles and content blocks


CHECKED_PATHS = frozenset(
    {CHAT, CHAT_BATCH, COMPLETIONS, DETOKENIZE, TOKENIZE, INVOCATIONS, RESPONSES, MESSAGES, COUNT_TOKENS}
)


def check_request(
    path: str, body: Mapping[str, Any], model: ModelFacts | None, raw: bytes | None = None
) -> RequestProblem | None:
    """The first problem of a request to `path`, or None. Bodies of the wrong shape are left to vLLM, whose
    schema validation names the field. `raw`, the body's bytes when known, spares the walk over every string of a
    body that cannot hold a surrogate: 10-40 us instead of 0.2-1.4 ms for a 30-50 KB body."""
    if path not in CHECKED_PATHS or not isinstance(body, Mapping):
        return None
    walk = raw is None or any(pattern.search(raw) for pattern in SURROGATE_BYTES)
    path = served_as(path, body)
    found = (check_lone_surrogate(body) if walk else None) or check_scalar_type(path, body)
    if found is not None or path == RESPONSES:
        return found or check_responses(body, model)
    if path in (MESSAGES, COUNT_TOKENS):
        return check_anthropic_messages(body.get("messages"))
    if path == DETOKENIZE:
        return check_token_ids(body.get("tokens"), model)
    if path == TOKENIZE:
        return check_no_messages(body.get("messages")) or check_messages(body.get("messages"), model)
    checks = [
        check_logit_bias(body),
        check_best_of(body),
        check_top_logprobs(body.get("top_logprobs")),
        check_sampling_ranges(body),
    ]
    if path == COMPLETIONS:
        checks += [check_empty_prompt(body.get("prompt")), check_prompt_ids(body.get("prompt"), model)]
    if path == CHAT:
        checks += [check_no_messages(body.get("messages")), check_messages(body.get("messages"), model)]
    if path == CHAT_BATCH:
        checks.append(check_conversations(body.get("messages"), model))
    if path in (CHAT, CHAT_BATCH):
        checks += [
            check_response_format(body.get("response_format")),
            check_tools(body.get("tools")),
            check_output_modalities(body),
        ]
        checks.append(check_web_search(body))
    return next((problem for problem in checks if problem is not None), None)


def served_as(path: str, body: Mapping[str, Any]) -> str:
    """The route vLLM serves a request to `path` as: SageMaker's /invocations is a chat request when its body has
    messages, else a completion."""
    if path == INVOCATIONS:
        return CHAT if isinstance(body.get("messages"), list) else COMPLETIONS
    return path
