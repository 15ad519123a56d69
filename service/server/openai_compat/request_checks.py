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

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
from jsonschema.protocols import Validator
from jsonschema.validators import Draft202012Validator, validator_for

from service.facts.model import ModelFacts
from service.server.openai_compat.scalar_fields import wrong_type

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
# What a block of Anthropic's content must carry, as Anthropic's API refuses it without (vLLM served a tool_result
# without its tool_use_id, 200).
ANTHROPIC_BLOCK_FIELDS = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",)}

# Roles of OpenAI's chat API (function: deprecated, still accepted by OpenAI).
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Roles whose messages OpenAI refuses without `content` (an assistant's may carry tool calls instead).
CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool", "function"})
# Content parts that carry something other than text (vLLM's names and OpenAI's).
MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "image_embeds", "image_pil", "audio_url", "input_audio", "video_url", "file"}
)
# The /v1/responses tool types vLLM serves without a tool server (which the service does not run): the rest are
# OpenAI's built-in tools (web_search, file_search, code_interpreter, mcp, ...), which vLLM drops from the request.
RESPONSES_TOOLS = frozenset({"function", "custom", "namespace"})
# A JSON "\ud800" escape decodes to half of a UTF-16 pair, which no UTF-8 text can hold.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# How a lone surrogate reaches a parsed body (json.loads decodes bytes with "surrogatepass"): the escape \udXXX, its
# UTF-8 bytes ED A0-BF, or a UTF-16/32 body (JSON starts with ASCII, so those hold a NUL byte). A whole pair matches
# too; only the walk tells them apart.
# One pattern each: an alternation would cost the regex engine its literal-prefix scan (0.18 ms for 36 KB, not 0.02).
SURROGATE_BYTES = (re.compile(rb"\\u[dD][89a-fA-F]"), re.compile(rb"\xed[\xa0-\xbf]"), re.compile(rb"\x00"))
LOGIT_BIAS_RANGE = (-100.0, 100.0)
PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's, for presence_penalty and frequency_penalty


@dataclass(frozen=True)
class RequestProblem:
    message: str
    param: str  # the offending field, e.g. "messages[2].role"


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
    found = (_lone_surrogate(body) if walk else None) or _scalar_type(path, body)
    if found is not None or path == RESPONSES:
        return found or _responses(body, model)
    if path in (MESSAGES, COUNT_TOKENS):
        return _anthropic_messages(body.get("messages"))
    if path == DETOKENIZE:
        return _token_ids(body.get("tokens"), model)
    if path == TOKENIZE:
        return _no_messages(body.get("messages")) or _messages(body.get("messages"), model)
    checks = [_logit_bias(body), _best_of(body), _top_logprobs(body.get("top_logprobs")), _sampling_ranges(body)]
    if path == COMPLETIONS:
        checks += [_empty_prompt(body.get("prompt")), _prompt_ids(body.get("prompt"), model)]
    if path == CHAT:
        checks += [_no_messages(body.get("messages")), _messages(body.get("messages"), model)]
    if path == CHAT_BATCH:
        checks.append(_conversations(body.get("messages"), model))
    if path in (CHAT, CHAT_BATCH):
        checks += [_response_format(body.get("response_format")), _tools(body.get("tools")), _output_modalities(body)]
        checks.append(_web_search(body))
    return next((problem for problem in checks if problem is not None), None)


def served_as(path: str, body: Mapping[str, Any]) -> str:
    """The route vLLM serves a request to `path` as: SageMaker's /invocations is a chat request when its body has
    messages, else a completion."""
    if path == INVOCATIONS:
        return CHAT if isinstance(body.get("messages"), list) else COMPLETIONS
    return path


def _messages(messages: Any, model: ModelFacts | None) -> RequestProblem | None:
    if not isinstance(messages, list):
        return None
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if not isinstance(role, (str, type(None))):  # a wrong shape (an object is not even hashable): vLLM names it
            continue
        if isinstance(role, str) and role not in ROLES:
            return RequestProblem(
                f"messages[{i}].role {role!r} is not a role: one of {', '.join(sorted(ROLES))}", f"messages[{i}].role"
            )
        if role in CONTENT_REQUIRED and message.get("content") is None:
            return RequestProblem(f"messages[{i}] ({role}) has no content", f"messages[{i}].content")
        if role == "assistant" and message.get("content") is None and not _calls_tools(message):
            return RequestProblem(
                f"messages[{i}] (assistant) has neither content nor tool_calls: an assistant message needs one",
                f"messages[{i}].content",
            )
        if role in CONTENT_REQUIRED and message["content"] == []:
            return RequestProblem(
                f"messages[{i}] ({role}) has an empty list of content parts: send a string or at least one part",
                f"messages[{i}].content",
            )
        if role == "tool" and not message.get("tool_call_id"):
            return RequestProblem(
                f"messages[{i}] has role 'tool' but no tool_call_id: a tool message answers the assistant's tool call "
                "with that id",
                f"messages[{i}].tool_call_id",
            )
        for problem in (
            _content_shape(i, message.get("content")),
            _content_parts(i, message.get("content"), model),
            _tool_calls(i, message.get("tool_calls")) if role == "assistant" else None,
        ):
            if problem is not None:
                return problem
    return None


def _anthropic_messages(messages: Any) -> RequestProblem | None:
    """Anthropic's Messages API in its own terms: roles user, assistant and system (a system message mid-conversation,
    which Claude Code sends and vLLM's protocol takes; any other role vLLM served, 200), content a non-empty string or
    list of blocks (an assistant's empty list was served), each block with the fields its type needs."""
    if not isinstance(messages, list):
        return None  # vLLM's schema names it
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return None
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant", "system"):
            return RequestProblem(
                f"messages[{i}].role: {role!r} is not a role of the Messages API (user, assistant, system)",
                f"messages[{i}].role",
            )
        if content in ("", []):
            return RequestProblem(
                f"messages[{i}].content is empty: send text or at least one block", f"messages[{i}].content"
            )
        for j, block in enumerate(content if isinstance(content, list) else ()):
            kind = block.get("type") if isinstance(block, Mapping) else None
            missing = [f for f in ANTHROPIC_BLOCK_FIELDS.get(kind, ()) if block.get(f) is None]
            if missing:
                where = f"messages[{i}].content[{j}].{missing[0]}"
                return RequestProblem(
                    f"{where}: Field required (a {kind} block carries {', '.join(ANTHROPIC_BLOCK_FIELDS[kind])})", where
                )
    return None


def _calls_tools(message: Mapping[str, Any]) -> bool:
    return bool(message.get("tool_calls")) or message.get("function_call") is not None


def _lone_surrogate(body: Mapping[str, Any]) -> RequestProblem | None:
    for where, text in _strings(body):
        found = LONE_SURROGATE.search(text)
        if found is not None:
            return RequestProblem(
                f"{where} is not valid Unicode text: it holds a lone surrogate \\u{ord(found.group()):04x} (half of a "
                "UTF-16 pair)",
                where,
            )
    return None


def _strings(body: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, string) of every string in a JSON body, keys included (a key's path is its object's). Walked with a
    stack, not recursion: a body nested as deep as the JSON parser allows must not overflow Python's stack."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            yield where or "body", value
        elif isinstance(value, Mapping):
            for key, item in value.items():
                yield where or "body", key
                stack.append((f"{where}.{key}" if where else key, item))
        elif isinstance(value, list):  # numbers (a prompt's token ids) are not pushed: they hold no text
            stack.extend(
                (f"{where}[{i}]", item)
                for i, item in enumerate(value)
                if item is not None and not isinstance(item, int | float)
            )


def _content_shape(i: int, content: Any) -> RequestProblem | None:
    """A message's content is a string or a list of parts; a text part carries its text as a string."""
    where = f"messages[{i}].content"
    if isinstance(content, Mapping):
        return RequestProblem(f"{where} must be a string or a list of content parts, not an object", where)
    if not isinstance(content, list):
        return None
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            if isinstance(part, str):
                continue  # vLLM takes bare strings in some roles' lists
            return RequestProblem(
                f'{where}[{j}] must be a content part object, such as {{"type": "text", "text": "..."}}',
                f"{where}[{j}]",
            )
        kind = part.get("type")
        if kind is None and "text" in part:
            return RequestProblem(
                f'{where}[{j}] has no type: a text part is {{"type": "text", "text": "..."}}', f"{where}[{j}].type"
            )
        if kind is not None and not isinstance(kind, str):
            return RequestProblem(f"{where}[{j}].type must be a string, such as 'text'", f"{where}[{j}].type")
        if kind is not None and kind not in _part_types():
            return RequestProblem(
                f"{where}[{j}].type {kind!r} is not a content part type: one of {', '.join(sorted(_part_types()))}",
                f"{where}[{j}].type",
            )
        if kind == "text" and not isinstance(part.get("text"), str):
            return RequestProblem(f"{where}[{j}] is a text part without a string 'text'", f"{where}[{j}].text")
    return None


@functools.cache
def _part_types() -> frozenset[str]:
    """The content part types vLLM's chat parser takes, as its own refusal lists them (which its request schema,
    checking parts one by one, never reaches: "8 validation errors for ValidatorIterator", no param)."""
    from vllm.renderers.chat_utils import MM_PARSER_MAP, PART_TYPES_TO_SKIP_NONE_CONTENT

    return frozenset(MM_PARSER_MAP) | frozenset(PART_TYPES_TO_SKIP_NONE_CONTENT)


def _tool_calls(i: int, tool_calls: Any) -> RequestProblem | None:
    """An assistant's tool calls as OpenAI's API spells them: [{id, type: "function", function: {name, arguments}}]."""
    where = f"messages[{i}].tool_calls"
    if tool_calls is None:
        return None
    if not isinstance(tool_calls, list):
        return RequestProblem(f"{where} must be a list of tool calls", where)
    for k, call in enumerate(tool_calls):
        at = f"{where}[{k}]"
        if not isinstance(call, Mapping):
            return RequestProblem(f"{at} must be a tool call object", at)
        if not isinstance(call.get("id"), str):
            return RequestProblem(f"{at}.id must be a string: the id its tool message answers", f"{at}.id")
        if call.get("type") != "function":
            return RequestProblem(f"{at}.type must be 'function', got {call.get('type')!r}", f"{at}.type")
        function = call.get("function")
        if not isinstance(function, Mapping):
            return RequestProblem(f"{at}.function must be an object with name and arguments", f"{at}.function")
        if not isinstance(function.get("name"), str):
            return RequestProblem(f"{at}.function.name must be a string", f"{at}.function.name")
        if not isinstance(function.get("arguments"), str):
            return RequestProblem(
                f"{at}.function.arguments must be a string (the arguments as JSON text)", f"{at}.function.arguments"
            )
    return None


def _no_messages(messages: Any) -> RequestProblem | None:
    """vLLM refuses an empty conversation without naming the field."""
    if messages == []:
        return RequestProblem("messages is empty: a chat request needs at least one message", "messages")
    return None


def _empty_prompt(prompt: Any) -> RequestProblem | None:
    """An empty list of prompts, or an empty prompt in a list (text or token ids): vLLM refuses them without naming
    the field ("You must pass at least one prompt", "The decoder prompt cannot be empty"). A lone empty string
    it refuses naming it."""
    if prompt == []:
        return RequestProblem("prompt is an empty list: send at least one prompt", "prompt")
    if isinstance(prompt, list):
        for i, item in enumerate(prompt):
            if item in ("", []):
                return RequestProblem(f"prompt[{i}] is empty: every prompt needs at least one token", f"prompt[{i}]")
    return None


def _conversations(conversations: Any, model: ModelFacts | None) -> RequestProblem | None:
    """A batch's conversations, each checked as a chat request's messages; the param says which one."""
    if not isinstance(conversations, list):
        return None
    for b, messages in enumerate(conversations):
        problem = _messages(messages, model)
        if problem is not None:
            return RequestProblem(
                problem.message.replace("messages[", f"messages[{b}][", 1),
                problem.param.replace("messages[", f"messages[{b}][", 1),
            )
    return None


def _content_parts(i: int, content: Any, model: ModelFacts | None, items: str = "messages") -> RequestProblem | None:
    if not isinstance(content, list) or model is None or model.is_multimodal:
        return None
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if isinstance(kind, str) and kind in MEDIA_PARTS:
            return RequestProblem(
                f"{items}[{i}].content[{j}] is a {kind!r} part, but the model takes text only",
                f"{items}[{i}].content[{j}]",
            )
    return None


def _token_ids(tokens: Any, model: ModelFacts | None, name: str = "tokens") -> RequestProblem | None:
    """Ids below 0 or beyond the model's vocabulary (its LM head's rows: no id the model produces is past them)."""
    if not isinstance(tokens, list):
        return None
    vocab = model.vocab_size if model is not None else None
    for i, token in enumerate(tokens):
        if isinstance(token, bool):  # vLLM's schema reads true as token 1
            return RequestProblem(f"{name}[{i}] is {str(token).lower()}, not a token id (an integer)", f"{name}[{i}]")
        if not isinstance(token, int):
            return None  # a type vLLM's schema names
        if token < 0 or (vocab is not None and token >= vocab):
            bound = f"0 .. {vocab - 1}" if vocab is not None else "not negative"
            return RequestProblem(f"{name}[{i}] = {token} is out of vocabulary ({bound})", f"{name}[{i}]")
    return None


def _prompt_ids(prompt: Any, model: ModelFacts | None) -> RequestProblem | None:
    """A completion's prompt as token ids: one list of ids, or a list of such lists."""
    if not isinstance(prompt, list) or not prompt:
        return None
    if not all(isinstance(p, list) for p in prompt):
        return _token_ids(prompt, model, "prompt")
    return next((p for i, ids in enumerate(prompt) if (p := _token_ids(ids, model, f"prompt[{i}]")) is not None), None)


def _scalar_type(path: str, body: Mapping[str, Any]) -> RequestProblem | None:
    wrong = wrong_type(path, body)
    return None if wrong is None else RequestProblem(*wrong)


def _top_logprobs(top: Any) -> RequestProblem | None:
    """OpenAI's range starts at 0; vLLM reads -1 as "the whole vocabulary" and refuses it naming logprobs."""
    if isinstance(top, int) and not isinstance(top, bool) and top < 0:
        return RequestProblem(f"top_logprobs must be between 0 and 20, got {top}", "top_logprobs")
    return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _sampling_ranges(body: Mapping[str, Any]) -> RequestProblem | None:
    low, high = PENALTY_RANGE
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if _number(value) and not low <= value <= high:
            return RequestProblem(f"{name} must be between {low:g} and {high:g}, got {value}", name)
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n < 1:
        return RequestProblem(f"n must be at least 1, got {n}", "n")
    # vLLM keeps the last k tokens of the prompt: 0 keeps none ("The decoder prompt cannot be empty", no param).
    if _number(truncate := body.get("truncate_prompt_tokens")) and truncate == 0:
        return RequestProblem(
            "truncate_prompt_tokens must be -1 (the model's context) or at least 1 (the prompt's last tokens kept), "
            "got 0",
            "truncate_prompt_tokens",
        )
    return None


def _output_modalities(body: Mapping[str, Any]) -> RequestProblem | None:
    """The engine answers in text: a request for audio would get text alone, which a client reading
    `message.audio` does not expect."""
    modalities = body.get("modalities")
    if isinstance(modalities, list):
        other = [m for m in modalities if m != "text"]
        if other:
            return RequestProblem(f"modalities {other} are not served: the model answers in text only", "modalities")
    if body.get("audio") is not None:
        return RequestProblem("audio output is not served: the model answers in text only", "audio")
    return None


def _best_of(body: Mapping[str, Any]) -> RequestProblem | None:
    """OpenAI's best_of generates that many completions and returns the n best; the engine cannot rank them, so
    only best_of == n (every completion returned) is served."""
    best_of, n = body.get("best_of"), body.get("n")
    n = 1 if n is None else n
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (best_of, n)):
        return None  # absent, or a type vLLM's schema names
    if best_of < n:
        return RequestProblem(f"best_of must be at least n: best_of={best_of}, n={n}", "best_of")
    if best_of > n:
        return RequestProblem(
            f"best_of={best_of} above n={n} is not supported: the engine does not rank completions; ask for "
            f"n={best_of} and pick, or leave best_of out",
            "best_of",
        )
    return None


def _logit_bias(body: Mapping[str, Any]) -> RequestProblem | None:
    bias = body.get("logit_bias")
    if not isinstance(bias, Mapping):
        return None
    low, high = LOGIT_BIAS_RANGE
    for token, value in bias.items():
        if _number(value) and not low <= value <= high:
            return RequestProblem(
                f"logit_bias[{token}] = {value} is out of range: biases go from {low:g} to {high:g}",
                f"logit_bias[{token}]",
            )
    return None


def _schema_problem(schema: Any, param: str) -> RequestProblem | None:
    if not isinstance(schema, Mapping):
        return None  # vLLM's own validation names the field
    if not isinstance(schema.get("$schema", ""), str):
        return RequestProblem(f"{param} is not a valid JSON Schema: $schema must be a URI string", param)
    meta = _meta_schema_check(validator_for(schema, default=Draft202012Validator))  # also for an unknown $schema
    error = next(meta.iter_errors(schema), None) if meta is not None else None
    if error is None:
        return None
    where = "/".join(str(p) for p in error.instance_path)
    return RequestProblem(
        f"{param} is not a valid JSON Schema: {error.message}" + (f" (at {where})" if where else ""), param
    )


@functools.cache
def _meta_schema_check(draft: type[Validator]) -> jsonschema_rs.Validator | None:
    """jsonschema-rs's check against a draft's meta-schema, compiled once. python-jsonschema (which still says which
    draft a schema declares, without fetching anything) took 5 ms per 20-property schema, on the event loop: 265 ms
    for a request with 50 tools. None for draft 3, which jsonschema-rs does not have: such a schema is left to vLLM's
    grammar compiler."""
    try:
        return jsonschema_rs.validator_for(draft.META_SCHEMA)
    except jsonschema_rs.ValidationError:
        return None


def _response_format(response_format: Any) -> RequestProblem | None:
    if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
        return None
    json_schema = response_format.get("json_schema")
    if not isinstance(json_schema, Mapping):
        return None
    return _schema_problem(json_schema.get("schema"), "response_format.json_schema.schema")


def _responses(body: Mapping[str, Any], model: ModelFacts | None) -> RequestProblem | None:
    """/v1/responses: vLLM named the limit `max_tokens` (its sampling field) and left `param` empty for an empty
    input list, for a JSON schema that is not one ("Grammar error: Invalid type: nonsense") and for an image sent to
    a text-only model ("X is not a multimodal model"); it serves a built-in tool's request without the tool."""
    limit = body.get("max_output_tokens")
    if _number(limit) and limit < 1:
        return RequestProblem(f"max_output_tokens must be at least 1, got {limit}", "max_output_tokens")
    items = body.get("input")
    if items == []:
        return RequestProblem("input is an empty list: send at least one item", "input")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, Mapping) and (problem := _content_parts(i, item.get("content"), model, "input")):
            return problem
    text = body.get("text")
    response_format = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        if (problem := _schema_problem(response_format.get("schema"), "text.format.schema")) is not None:
            return problem
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if isinstance(kind, str) and kind not in RESPONSES_TOOLS:
            return RequestProblem(
                f"tools[{i}] is a built-in {kind!r} tool, which this server does not run (it has no tool server): "
                f"send function tools",
                f"tools[{i}].type",
            )
        if kind == "function":
            if (problem := _schema_problem(tool.get("parameters"), f"tools[{i}].parameters")) is not None:
                return problem
    return None


def _web_search(body: Mapping[str, Any]) -> RequestProblem | None:
    """OpenAI's search models' option, which vLLM ignores: the answer would come without the search asked for."""
    if body.get("web_search_options") is None:
        return None
    return RequestProblem("web_search_options: this server does not search the web", "web_search_options")


def _tools(tools: Any) -> RequestProblem | None:
    if not isinstance(tools, list):
        return None
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping):
            problem = _schema_problem(function.get("parameters"), f"tools[{i}].function.parameters")
            if problem is not None:
                return problem
    return None
