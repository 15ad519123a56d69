"""OpenAI-strict request checks (service/server/openai_compat/request_checks/): the problem and the field it names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.facts.model import inspect_model
from service.server.openai_compat.request_checks import (
    CHAT_BATCH,
    DETOKENIZE,
    INVOCATIONS,
    RESPONSES,
    TOKENIZE,
    RequestProblem,
    check_request,
)
from service.server.openai_compat.scalar_fields import scalar_fields

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "models"
TEXT_MODEL = inspect_model(str(FIXTURES / "llama-3.1-8b-instruct"))
VISION_MODEL = dataclasses.replace(TEXT_MODEL, is_multimodal=True)
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = {"role": "user", "content": "hi"}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def assistant(*calls: object) -> dict:
    return {"messages": [USER, {"role": "assistant", "tool_calls": list(calls)}]}


def problem(body: dict, path: str = CHAT, model=TEXT_MODEL) -> RequestProblem | None:
    return check_request(path, {"model": "m", **body}, model)


@pytest.mark.parametrize(
    "body,param,words",
    [
        ({"messages": [USER, {"role": "wizard", "content": "hi"}]}, "messages[1].role", "'wizard' is not a role"),
        ({"messages": [{"role": "tool", "content": "22 C"}]}, "messages[0].tool_call_id", "no tool_call_id"),
        ({"messages": [{"role": "system", "content": "x"}, {"role": "user"}]}, "messages[1].content", "no content"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "no content"),
        ({"messages": [USER, {"role": "assistant"}, USER]}, "messages[1].content", "neither content nor tool_calls"),
        (
            {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": []}]},
            "messages[1].content",
            "neither content nor tool_calls",
        ),
        ({"messages": [{"role": "system", "content": []}, USER]}, "messages[0].content", "empty list of content parts"),
        ({"messages": [USER], "logprobs": True, "top_logprobs": -1}, "top_logprobs", "between 0 and 20"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, IMAGE]}]},
            "messages[0].content[1]",
            "'image_url' part, but the model takes text only",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
                ]
            },
            "messages[0].content[0]",
            "text only",
        ),
        ({"messages": [USER], "logit_bias": {"5": 150}}, "logit_bias[5]", "out of range"),
        (
            {
                "messages": [USER],
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "flurb"}}},
            },
            "response_format.json_schema.schema",
            "not a valid JSON Schema",
        ),
        (
            {
                "messages": [USER],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"minLength": -1}}}},
                },
            },
            "response_format.json_schema.schema",
            "(at properties/a/minLength)",
        ),
        (
            {
                "messages": [USER],
                "tools": [TOOL, {"type": "function", "function": {"name": "f", "parameters": {"required": "city"}}}],
            },
            "tools[1].function.parameters",
            "not a valid JSON Schema",
        ),
        (
            {
                "messages": [USER],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$schema": [1]}}}],
            },
            "tools[0].function.parameters",
            "$schema must be a URI string",
        ),
        ({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]}, "messages[0].content", "a list"),
        ({"messages": [{"role": "user", "content": [None]}]}, "messages[0].content[0]", "content part object"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text", "text part"),
        (
            {"messages": [{"role": "system", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
            "",
        ),
        ({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}, "messages[0].content[0].type", "no type"),
        ({"messages": [{"role": "user", "content": [{"type": ["image_url"]}]}]}, "messages[0].content[0].type", ""),
        ({"messages": [USER, {"role": "assistant", "tool_calls": "x"}]}, "messages[1].tool_calls", "a list"),
        (assistant(None), "messages[1].tool_calls[0]", "object"),
        (assistant({"id": 1, "type": "function", "function": CALL}), "messages[1].tool_calls[0].id", "string"),
        (assistant({"id": "c", "function": CALL}), "messages[1].tool_calls[0].type", "'function'"),
        (assistant({"id": "c", "type": "function"}), "messages[1].tool_calls[0].function", "name and arguments"),
        (
            assistant({"id": "c", "type": "function", "function": {"arguments": "{}"}}),
            "messages[1].tool_calls[0].function.name",
            "string",
        ),
        (
            assistant({"id": "c", "type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}}),
            "messages[1].tool_calls[0].function.arguments",
            "JSON text",
        ),
    ],
    ids=[
        "role",
        "tool-without-id",
        "no-content",
        "null-content",
        "assistant-without-content-or-calls",
        "assistant-with-an-empty-list-of-calls",
        "empty-content-list",
        "negative-top-logprobs",
        "image-to-text-model",
        "audio-to-text-model",
        "logit-bias-range",
        "schema-type",
        "schema-where",
        "tool-parameters",
        "schema-dialect-not-a-string",
        "content-an-object",
        "part-not-an-object",
        "text-part-without-text",
        "text-not-a-string",
        "text-part-without-type",
        "part-type-a-list",
        "tool-calls-not-a-list",
        "tool-call-not-an-object",
        "tool-call-id-int",
        "tool-call-without-type",
        "tool-call-without-function",
        "tool-call-without-name",
        "tool-call-arguments-an-object",
    ],
)
def test_problems_name_the_field(body, param, words):
    found = problem(body)
    assert found is not None and found.param == param and words in found.message, found


@pytest.mark.parametrize(
    "body,path,model",
    [
        ({"messages": [{"role": "developer", "content": "be brief"}, USER]}, CHAT, TEXT_MODEL),
        ({"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]}, CHAT, TEXT_MODEL),
        (
            {
                "messages": [
                    USER,
                    {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": CALL}]},
                ]
            },
            CHAT,
            TEXT_MODEL,
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, IMAGE]}]},
            CHAT,
            VISION_MODEL,
        ),
        ({"messages": [USER], "logit_bias": {"5": -100, "6": 100}}, CHAT, TEXT_MODEL),
        (
            {
                "messages": [USER],
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            },
            CHAT,
            TEXT_MODEL,
        ),
        ({"messages": [USER], "tools": [TOOL]}, CHAT, TEXT_MODEL),
        ({"prompt": "hi", "logit_bias": {"5": 10}}, COMPLETIONS, TEXT_MODEL),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "/v1/responses", TEXT_MODEL),  # its input is not messages
        ({"messages": [{"role": "user", "content": [IMAGE]}]}, CHAT, None),  # no model facts: left to vLLM
    ],
    ids=[
        "developer",
        "tool-with-id",
        "assistant-with-tool-calls-only",
        "image-to-vision-model",
        "bias-at-limits",
        "valid-schema",
        "valid-tool",
        "completions",
        "other-path",
        "no-model-facts",
    ],
)
def test_valid_requests_pass(body, path, model):
    assert problem(body, path, model) is None


@pytest.mark.parametrize(
    "body",
    [
        {"messages": "hi"},
        {"messages": [5, None]},
        {"messages": [{"role": 7}]},
        {"messages": [{"role": {}, "content": "hi"}]},
        {"messages": [USER, {"role": ["user"]}]},
        {"logit_bias": [1, 2]},
        {"logit_bias": {"5": "high"}},
        {"messages": [USER], "response_format": {"type": "json_schema", "json_schema": {"schema": 5}}},
        {"messages": [USER], "tools": "all"},
    ],
    ids=[
        "messages-str",
        "messages-not-objects",
        "role-int",
        "role-object",
        "role-list",
        "bias-list",
        "bias-str",
        "schema-int",
        "tools-str",
    ],
)
def test_wrong_shapes_are_left_to_vllm_which_names_them(body):
    assert problem(body) is None
    assert check_request(CHAT, ["not", "an", "object"], TEXT_MODEL) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "chat", "completion"),
    [
        ({"presence_penalty": 3}, "presence_penalty", "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty", "frequency_penalty"),
        ({"n": 0}, "n", "n"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": -1}, None, None),  # the model's context
        ({"truncate_prompt_tokens": 5}, None, None),
        ({"modalities": ["text", "audio"]}, "modalities", None),  # completions have no output modalities
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", None),
        ({"presence_penalty": 2, "frequency_penalty": -2, "n": 1, "modalities": ["text"], "audio": None}, None, None),
    ],
)
def test_sampling_ranges_and_output_modalities(fields, chat, completion):
    found = check_request(CHAT, {"messages": [USER], **fields}, TEXT_MODEL)
    assert (found and found.param) == chat, found
    found = check_request(COMPLETIONS, {"prompt": "hi", **fields}, TEXT_MODEL)
    assert (found and found.param) == completion, found


def test_completions_check_logit_bias_too():
    found = problem({"prompt": "hi", "logit_bias": {"7": -101}}, COMPLETIONS)
    assert found is not None and found.param == "logit_bias[7]"


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(
    "fields,refused",
    [
        ({"best_of": 3}, "not supported"),
        ({"best_of": 4, "n": 2}, "not supported"),
        ({"best_of": 1, "n": 2}, "at least n"),
        ({"best_of": 2, "n": 2}, None),  # every completion returned: nothing to rank
        ({"best_of": 1}, None),
        ({"best_of": 1, "n": None}, None),
        ({"best_of": None, "n": 3}, None),
        ({"best_of": "3"}, None),  # a type vLLM's schema names
        ({"best_of": True}, None),
    ],
)
def test_best_of_is_served_only_where_nothing_needs_ranking(path, fields, refused):
    body = {"prompt": "hi"} if path == COMPLETIONS else {"messages": [{"role": "user", "content": "hi"}]}
    found = problem(body | fields, path)
    if refused is None:
        assert found is None
    else:
        assert found is not None and found.param == "best_of" and refused in found.message, found


def test_a_batch_checks_each_conversation_and_names_it():
    hi = [{"role": "user", "content": "hi"}]
    assert check_request(CHAT_BATCH, {"messages": [hi, hi]}, TEXT_MODEL) is None
    found = check_request(CHAT_BATCH, {"messages": [hi, [*hi, {"role": "wizard", "content": "x"}]]}, TEXT_MODEL)
    assert found is not None and found.param == "messages[1][1].role" and found.message.startswith("messages[1][1]")
    found = check_request(CHAT_BATCH, {"messages": [hi], "logit_bias": {"5": 500}}, TEXT_MODEL)
    assert found is not None and found.param == "logit_bias[5]"
    assert check_request(CHAT_BATCH, {"messages": ["not a conversation", 3]}, TEXT_MODEL) is None  # vLLM names it


@pytest.mark.parametrize(
    "tokens,param",
    [
        ([1, 2, 128255], None),  # the last id of the vocabulary
        ([1, 128256], "tokens[1]"),
        ([-1], "tokens[0]"),
        ([], None),
        ([1, "x", 10**9], None),  # a type vLLM's schema names
        ("1 2", None),
    ],
)
def test_detokenize_refuses_ids_outside_the_vocabulary(tokens, param):
    assert TEXT_MODEL.vocab_size == 128256
    found = check_request(DETOKENIZE, {"model": "m", "tokens": tokens}, TEXT_MODEL)
    assert (found and found.param) == param, found
    if found:
        assert "0 .. 128255" in found.message


def test_detokenize_without_a_known_vocabulary_refuses_negative_ids_only():
    unknown = dataclasses.replace(TEXT_MODEL, vocab_size=None)
    assert check_request(DETOKENIZE, {"tokens": [10**9]}, unknown) is None
    found = check_request(DETOKENIZE, {"tokens": [3, -2]}, unknown)
    assert found is not None and found.param == "tokens[1]" and "not negative" in found.message


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}], "messages[1].tool_call_id"),
        ([{"role": "system"}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], None),
    ],
)
def test_tokenize_checks_chat_messages_as_the_chat_route_does(messages, param):
    found = check_request(TOKENIZE, {"model": "m", "messages": messages}, TEXT_MODEL)
    assert (found and found.param) == param, found
    assert (found and found.param) == ((chat := check_request(CHAT, {"messages": messages}, TEXT_MODEL)) and chat.param)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "x"}]}],
        [{"role": "user", "content": ["bare strings are vLLM's to judge"]}],
        [{"role": "user", "content": [{"image_url": "https://example.com/a.png"}]}],  # vLLM's short image part
        [USER, {"role": "assistant", "content": "", "tool_calls": None}],
        [USER, {"role": "assistant", "content": "ok", "tool_calls": []}],
        [USER, {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}}],  # deprecated
        [
            USER,
            {"role": "assistant", "content": [], "tool_calls": [{"id": "c1", "type": "function", "function": CALL}]},
        ],
        [
            USER,
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": CALL}]},
        ],
        [{"role": "user", "content": ""}],  # OpenAI serves an empty string
        [{"role": "user", "content": "hi", "tool_calls": "a user's tool calls are ignored, as vLLM does"}],
    ],
)
def test_content_and_tool_calls_vllm_serves_pass(messages):
    assert problem({"messages": messages}, model=VISION_MODEL) is None


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": [USER], "stop": ["ok", "\ud800"]}, "stop[1]"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]},
            "messages[0].content[0].text",
        ),
        (COMPLETIONS, {"prompt": ["ok", "\udc00"]}, "prompt[1]"),
        (TOKENIZE, {"prompt": "\ud83d"}, "prompt"),
        (CHAT, {"messages": [USER], "chat_template_kwargs": {"\ud800": 1}}, "chat_template_kwargs"),
        (CHAT, {"messages": [USER], "stop": ["\U0001f600 a whole pair is one character"]}, None),
    ],
)
def test_a_lone_surrogate_anywhere_is_named(path, body, param):
    found = check_request(path, {"model": "m", **body}, TEXT_MODEL)
    assert (found and found.param) == param, found
    if found:
        assert "lone surrogate" in found.message


def test_a_body_nested_as_deep_as_json_allows_is_walked_without_recursion():
    deep: object = "\ud800"
    for _ in range(5000):
        deep = [deep]
    found = check_request(CHAT, {"messages": [USER], "vllm_xargs": deep}, TEXT_MODEL)
    assert found is not None and found.param.startswith("vllm_xargs[0][0]")


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ([1, 128256], "prompt[1]"),
        ([[1, 2], [128255, 10**9]], "prompt[1][1]"),
        ([[1, 2], [128255]], None),
        ([1, True], "prompt[1]"),
        ([[1], [False]], "prompt[1][0]"),
        (["a", "b"], None),
        ([], "prompt"),
    ],
)
def test_prompt_token_ids_outside_the_vocabulary_are_named(prompt, param):
    found = check_request(COMPLETIONS, {"prompt": prompt}, TEXT_MODEL)
    assert (found and found.param) == param, found


def test_tokenize_of_a_prompt_is_not_checked():
    assert check_request(TOKENIZE, {"model": "m", "prompt": "wizard"}, TEXT_MODEL) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "tokens",
    "prompt",
    "tool_calls",
    "text",
    "id",
    "messages",
    "best_of",
    "n",
    "logit_bias",
    "response_format",
    "tools",
    "role",
    "content",
    "type",
    "json_schema",
    "schema",
    "function",
    "parameters",
    "$schema",
    "tool_call_id",
    "max_output_tokens",
    "input",
    "format",
]
# Objects keyed by the names the checks look at, so the fuzz reaches them.
SHAPED = st.recursive(
    JSON,
    lambda inner: st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=16,
)


@settings(max_examples=50, deadline=None)
@given(
    body=st.dictionaries(st.sampled_from(FIELDS), SHAPED, max_size=4),
    path=st.sampled_from([CHAT, COMPLETIONS, DETOKENIZE, TOKENIZE, RESPONSES]),
)
@example(body={"messages": [{"tokens": {}, "prompt": {}, "role": {}}]}, path=CHAT)  # found in CI: a role not hashable
def test_any_json_body_gets_an_answer_never_an_exception(body, path):
    found = check_request(path, body, TEXT_MODEL)
    assert found is None or (found.message and found.param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),  # served as a chat request
        ({"messages": [USER], "stop": ["\ud800"]}, "stop[0]"),
        ({"prompt": [1, 128256]}, "prompt[1]"),  # served as a completion
        ({"prompt": "hi", "best_of": 3}, "best_of"),
        ({"messages": [USER]}, None),
    ],
)
def test_sagemaker_invocations_get_the_checks_of_what_vllm_serves_them_as(body, param):
    found = check_request(INVOCATIONS, {"model": "m", **body}, TEXT_MODEL)
    assert (found and found.param) == param, found


def test_responses_get_the_surrogate_check_alone():
    found = check_request(RESPONSES, {"model": "m", "input": "a\ud800"}, TEXT_MODEL)
    assert found is not None and found.param == "input"
    assert check_request(RESPONSES, {"input": [{"role": "wizard", "content": "x"}]}, TEXT_MODEL) is None


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.characters(codec=None), max_size=8),
    ensure_ascii=st.booleans(),
    encoding=st.sampled_from(["utf-8", "utf-16", "utf-32-le"]),
)
def test_the_raw_body_never_hides_a_surrogate_the_walk_would_find(text, ensure_ascii, encoding):
    """Every way a lone surrogate reaches the parsed body (an escape, UTF-8 bytes json.loads lets through, a UTF-16
    or UTF-32 body) shows in the raw bytes: the walk is skipped only for bodies that cannot hold one."""
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    raw = json.dumps(body, ensure_ascii=ensure_ascii).encode(encoding, "surrogatepass")
    assert json.loads(raw) == body
    assert check_request(CHAT, body, TEXT_MODEL, raw) == check_request(CHAT, body, TEXT_MODEL)


def test_a_surrogate_sent_as_raw_utf8_bytes_is_named():
    raw = b'{"model": "m", "prompt": "a\xed\xa0\x80b"}'
    found = check_request(COMPLETIONS, json.loads(raw), TEXT_MODEL, raw)
    assert found is not None and found.param == "prompt"


@pytest.mark.parametrize(
    ("declared", "named"),
    [
        ("http://json-schema.org/draft-07/schema#", True),
        ("http://json-schema.org/draft-04/schema#", True),
        ("https://example.com/a-meta-schema-nobody-knows", True),  # the latest draft, nothing fetched
        ("http://json-schema.org/draft-03/schema#", False),  # jsonschema-rs has no draft 3: left to vLLM
    ],
)
def test_a_schema_is_checked_against_the_draft_it_declares(declared, named):
    schema = {"$schema": declared, "type": "object", "properties": {"a": {"type": "strnig"}}}
    found = problem(
        {"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
    )
    assert (found is not None) == named, found
    if named:
        assert found.param == "tools[0].function.parameters" and "(at properties/a/type)" in found.message


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": []}, "messages"),
        (TOKENIZE, {"messages": []}, "messages"),
        (INVOCATIONS, {"messages": []}, "messages"),
        (COMPLETIONS, {"prompt": []}, "prompt"),
        (COMPLETIONS, {"prompt": ["hi", ""]}, "prompt[1]"),
        (COMPLETIONS, {"prompt": [[1], []]}, "prompt[1]"),
        (INVOCATIONS, {"prompt": []}, "prompt"),
        (COMPLETIONS, {"prompt": ""}, None),  # vLLM names it itself
        (COMPLETIONS, {"prompt": [0, 1]}, None),  # token id 0 is a token
        (TOKENIZE, {"prompt": ""}, None),  # counts zero tokens, as vLLM answers
        (CHAT_BATCH, {"messages": [[USER], []]}, None),  # vLLM's schema names messages[1]
    ],
)
def test_empty_prompts_and_conversations_are_named(path, body, param):
    found = check_request(path, {"model": "m", **body}, TEXT_MODEL)
    assert (found and found.param) == param, found


@pytest.mark.parametrize("kind", ["weird", "file", "input_file"])
def test_a_content_part_type_vllm_does_not_take_is_named(kind):
    found = problem({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": kind}]}]})
    assert found is not None and found.param == "messages[0].content[1].type", found
    assert f"{kind!r} is not a content part type: one of " in found.message and "image_url" in found.message


def test_every_content_part_type_vllm_takes_passes():
    from vllm.renderers.chat_utils import MM_PARSER_MAP

    assert {"text", "image_url", "input_audio", "refusal"} <= set(MM_PARSER_MAP)
    for kind in MM_PARSER_MAP:
        part = {"type": kind, "text": "x"} if kind == "text" else {"type": kind}
        found = problem({"messages": [{"role": "user", "content": [part]}]}, model=VISION_MODEL)
        assert found is None or not found.param.endswith(".type"), (kind, found)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "max_output_tokens": -3.5}, "max_output_tokens"),
        ({"input": []}, "input"),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}},
            "text.format.schema",
        ),
        (
            {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"required": "a"}}]},
            "tools[0].parameters",
        ),
        ({"input": "hi", "max_output_tokens": 1, "text": {"format": {"type": "json_schema", "schema": {}}}}, None),
        # A built-in tool: vLLM serves the request without it (the service runs no tool server).
        ({"input": [{"role": "user", "content": "hi"}], "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "tools": [TOOL | {"name": "f"}, {"type": "mcp", "server_label": "x"}]}, "tools[1].type"),
        ({"input": "hi", "tools": [{"type": "custom", "name": "run"}]}, None),  # vLLM's free-form tool
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,A"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}, None),
        ({"input": "hi", "max_output_tokens": True}, "max_output_tokens"),  # vLLM's lax schema served it as 1
    ],
)
def test_responses_name_the_output_limit_an_empty_input_and_schemas_that_are_not_ones(body, param):
    found = check_request(RESPONSES, {"model": "m", **body}, TEXT_MODEL)
    assert (found and found.param) == param, found


def test_a_responses_image_is_named_for_a_text_only_model_and_served_to_a_multimodal_one():
    body = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}
    found = check_request(RESPONSES, body, TEXT_MODEL)
    assert (
        found is not None
        and found.message == "input[0].content[0] is a 'input_image' part, but the model takes text only"
    )
    assert check_request(RESPONSES, body, VISION_MODEL) is None


@pytest.mark.parametrize("options", [{}, {"search_context_size": "low"}])
def test_web_search_options_are_named_as_this_server_does_not_search(options):
    found = problem({"messages": [USER], "web_search_options": options})
    assert found is not None and found.param == "web_search_options", found
    assert problem({"messages": [USER], "web_search_options": None}) is None


@pytest.mark.parametrize(
    ("path", "field", "value", "message"),
    [
        (
            COMPLETIONS,
            "max_tokens",
            "2",
            "Invalid type for 'max_tokens': expected an integer, but got a string instead.",
        ),
        (CHAT, "stream", "yes", "Invalid type for 'stream': expected a boolean, but got a string instead."),
        (CHAT, "temperature", True, "Invalid type for 'temperature': expected a number, but got a boolean instead."),
        (CHAT, "logprobs", 1, "Invalid type for 'logprobs': expected a boolean, but got a number instead."),
        (COMPLETIONS, "logprobs", True, "Invalid type for 'logprobs': expected an integer, but got a boolean instead."),
        (COMPLETIONS, "truncate_prompt_tokens", "5", "expected an integer, but got a string"),  # Annotated[int, ...]
        ("/v1/responses", "max_output_tokens", "3", "expected an integer, but got a string"),
        ("/invocations", "n", [2], "Invalid type for 'n': expected an integer, but got an array instead."),
    ],
)
def test_a_number_or_boolean_of_another_json_type_is_refused_naming_it(path, field, value, message):
    body = {"messages": [USER]} if path == CHAT or path == "/invocations" else {"prompt": "hi", "input": "hi"}
    problem = check_request(path, {**body, field: value}, TEXT_MODEL)
    assert problem is not None and problem.param == field and message in problem.message


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, "/v1/responses"])
def test_every_number_and_boolean_field_of_vllms_request_model_takes_its_own_type_and_null(path):
    fields = scalar_fields(path)
    assert {"stream", "temperature", "top_p", "seed"} <= set(fields)
    body = {"messages": [USER], "prompt": "hi", "input": "hi"}
    for field, kind in fields.items():
        for value in (None, {bool: False, int: 3, float: 0.5}[kind], *([1] if kind is float else [])):
            problem = check_request(path, {**body, field: value}, TEXT_MODEL)
            assert problem is None or problem.param != field, (field, value, problem)
        problem = check_request(path, {**body, field: "1"}, TEXT_MODEL)
        assert problem is not None and problem.param == field, (field, problem)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_messages_are_checked_in_their_own_terms(path):
    hi = [{"role": "user", "content": "hi"}]
    cases = {
        "messages[0].role": [{"role": "tool", "content": "hi"}],
        "messages[1].content": [*hi, {"role": "assistant", "content": []}],
        "messages[0].content[0].tool_use_id": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
        "messages[0].content[0].input": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
        ],
    }
    for param, messages in cases.items():
        problem = check_request(path, {"model": "m", "messages": messages}, None)
        assert problem is not None and problem.param == param, (param, problem)
    # a system message mid-conversation, as Claude Code sends it (and vLLM's protocol takes)
    ok = [*hi, {"role": "system", "content": "be brief"}]
    ok.append({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]})
    ok.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]})
    assert check_request(path, {"model": "m", "messages": ok}, None) is None
    if path == "/v1/messages":  # count_tokens takes no number or boolean field
        assert check_request(path, {"model": "m", "messages": hi, "stream": "yes"}, None).param == "stream"
