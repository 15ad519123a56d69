"""Bad input against the real server: named cases with exact answers, then schemathesis on every route of
the service's own OpenAPI schema. Never a 5xx; every error in the OpenAI shape."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.reliability import st_hooks
from tests.reliability.conftest import MAX_MODEL_LEN, MAX_QUEUED, MAX_REQUEST_BYTES, SERVED
from tests.support.server import REPO

pytestmark = pytest.mark.engine

ERROR_FIELDS = {"message", "type", "param", "code"}


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, f"expected {status}, got {resp.status_code}: {resp.text[:500]}"
    body = resp.json()
    assert set(body) == {"error"}, body
    assert ERROR_FIELDS <= set(body["error"]), body
    assert body["error"]["code"] == status, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    return body["error"]


def post(server, path: str, *, content: bytes | None = None, json_body: object = None, headers=None) -> httpx.Response:
    hdrs = {"Content-Type": "application/json", **server.headers(), **(headers or {})}
    if json_body is not None:
        content = json.dumps(json_body).encode()
    return httpx.post(f"{server.url}{path}", content=content, headers=hdrs, timeout=60)


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "path,content",
    [
        (COMPLETIONS, b'{"model": "demo-tiny-llama", "prompt": '),
        (CHAT, b'{"model": "demo-tiny-llama", "messages": [}'),
        (COMPLETIONS, b"not json at all"),
        (CHAT, b""),
    ],
    ids=["truncated", "bad-bracket", "not-json", "empty"],
)
def test_malformed_json_is_400(server, path, content):
    assert_openai_error(post(server, path, content=content), 400)


@pytest.mark.parametrize(
    "content,message",
    [
        (
            b'{"model": "demo-tiny-llama", "prompt": ',
            "the request body is not valid JSON: Expecting value at character",
        ),
        (b'[{"model": "demo-tiny-llama"}]', "the request body must be a JSON object, not an array"),
        (b"null", "the request body is empty or null: send a JSON object"),
    ],
    ids=["truncated", "array", "null"],
)
def test_a_body_that_is_not_a_json_object_is_named_in_one_line(server, content, message):
    error = assert_openai_error(post(server, COMPLETIONS, content=content), 400)
    assert error["message"].startswith(message) and "\n" not in error["message"], error


@pytest.mark.parametrize(
    "path,body,param",
    [
        (COMPLETIONS, {"model": SERVED, "prompt": "hi", "max_tokens": "many"}, "max_tokens"),
        (COMPLETIONS, {"model": SERVED, "prompt": "hi", "temperature": "hot"}, "temperature"),
        (COMPLETIONS, {"model": SERVED, "prompt": {"a": 1}}, "prompt"),
        (CHAT, {"model": SERVED, "messages": "hi"}, "messages"),
        (CHAT, {"model": SERVED, "messages": MSG, "stream": "yes please"}, "stream"),
        (CHAT, {"model": SERVED, "messages": MSG, "n": [1]}, "n"),
    ],
    ids=["max_tokens-str", "temperature-str", "prompt-object", "messages-str", "stream-str", "n-list"],
)
def test_wrong_types_are_400_naming_the_field(server, path, body, param):
    error = assert_openai_error(post(server, path, json_body=body), 400)
    assert param in (error["param"] or "") or param in error["message"], error


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.mark.parametrize(
    "path,body,param",
    [
        (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, IMAGE]}]},
            "messages[0].content[1]",
        ),
        (CHAT, {"messages": [{"role": "tool", "content": "22 C"}]}, "messages[0].tool_call_id"),
        (
            CHAT,
            {"messages": MSG, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (CHAT, {"messages": MSG, "stop": [1, 2]}, "stop"),
        (COMPLETIONS, {"prompt": "hi", "stop": 5}, "stop"),
        (CHAT, {"messages": MSG, "logit_bias": {"999999": 1}}, "logit_bias"),
        (COMPLETIONS, {"prompt": "hi", "logit_bias": {"-1": 1}}, "logit_bias"),
        (CHAT, {"messages": MSG, "logit_bias": {"5": 500}}, "logit_bias[5]"),
        (
            CHAT,
            {
                "messages": MSG,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "flurb"}}},
            },
            "response_format.json_schema.schema",
        ),
        (
            CHAT,
            {
                "messages": MSG,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"required": 3}}}],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
        ),
        (COMPLETIONS, {"prompt": "hi", "best_of": 3}, "best_of"),
        (CHAT, {"messages": MSG, "best_of": 1, "n": 2}, "best_of"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens[1]"),
        ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
        (CHAT, {"messages": [{"role": "user"}]}, "messages[0].content"),
        (CHAT, {"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
        (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        (CHAT, {"messages": MSG, "modalities": ["text", "audio"]}, "modalities"),
        (COMPLETIONS, {"prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
        (CHAT, {"messages": MSG, "n": 0}, "n"),
        (COMPLETIONS, {"prompt": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        # json.dumps writes the lone surrogate as the escape "\ud800"; as a stop string it was a 500.
        (CHAT, {"messages": MSG, "stop": ["\ud800"]}, "stop[0]"),
        (COMPLETIONS, {"prompt": "a\udc00"}, "prompt"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        (CHAT, {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]}, "messages[0].content"),
        (
            CHAT,
            {"messages": [*MSG, {"role": "assistant", "tool_calls": [{"id": 1, "type": "function"}]}]},
            "messages[1].tool_calls[0].id",
        ),
        (COMPLETIONS, {"prompt": [[1, 10**9]]}, "prompt[0][1]"),
        (COMPLETIONS, {"prompt": [1, True]}, "prompt[1]"),
        (CHAT, {"messages": MSG, "top_k": -5}, "top_k"),
        (COMPLETIONS, {"prompt": "hi", "stop": [""]}, "stop"),
        ("/invocations", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ("/invocations", {"messages": MSG, "stop": ["\ud800"]}, "stop[0]"),
        ("/v1/responses", {"input": "a\ud800"}, "input"),
        (CHAT, {"messages": []}, "messages"),
        (COMPLETIONS, {"prompt": ["hi", ""]}, "prompt[1]"),
        ("/invocations", {"prompt": []}, "prompt"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "weird"}]}]}, "messages[0].content[0].type"),
        # vLLM's parser map takes the part type, the user role's schema does not (vLLM: "7 validation errors", param null)
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
            "messages[0].content[0].type",
        ),
        # Output constraints that pass the schema checks but do not compile (vLLM: "Grammar error ...", param null)
        (CHAT, {"messages": MSG, "structured_outputs": {"regex": "a("}}, "structured_outputs.regex"),
        (CHAT, {"messages": MSG, "stream": True, "structured_outputs": {"regex": "a("}}, "structured_outputs.regex"),
        (COMPLETIONS, {"prompt": "hi", "structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar"),
        (
            CHAT,
            {
                "messages": MSG,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}},
            },
            "response_format.json_schema.schema",
        ),
        (
            CHAT,
            {
                "messages": MSG,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools[0].function.parameters",
        ),
        # vLLM named it max_tokens; param null for the next two
        ("/v1/responses", {"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ("/v1/responses", {"input": []}, "input"),
        (
            "/v1/responses",
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
            "text.format.schema",
        ),
        # served before: pydantic's lax mode read them as 2, a stream, 1.0, 1 and true
        (COMPLETIONS, {"prompt": "hi", "max_tokens": "2"}, "max_tokens"),
        (CHAT, {"messages": MSG, "stream": "true"}, "stream"),
        (CHAT, {"messages": MSG, "temperature": True}, "temperature"),
        ("/v1/responses", {"input": "hi", "max_output_tokens": True}, "max_output_tokens"),
        ("/invocations", {"messages": MSG, "logprobs": 1}, "logprobs"),
        # served without what they ask for: the search, the built-in tool; vLLM's 400 for the image named no field
        (CHAT, {"messages": [*MSG, {"role": "assistant"}, *MSG]}, "messages[1].content"),
        # a hosted tool the request forces: not served without it (one merely offered is left out, below)
        (
            "/v1/responses",
            {"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
            "tools[0].type",
        ),
        (
            "/v1/responses",
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": IMAGE["image_url"]["url"]}]}]},
            "input[0].content[0]",
        ),
    ],
    ids=[
        "unknown-role",
        "image-to-text-model",
        "tool-message-without-id",
        "tool-choice-not-in-tools",
        "stop-ints",
        "stop-int-completions",
        "logit-bias-out-of-vocab",
        "logit-bias-negative-id",
        "logit-bias-out-of-range",
        "schema-not-a-schema",
        "tool-parameters-not-a-schema",
        "best-of-above-n",
        "best-of-below-n",
        "detokenize-out-of-vocab",
        "detokenize-negative-id",
        "message-without-content",
        "message-with-an-empty-content-list",
        "negative-top-logprobs",
        "tokenize-unknown-role",
        "audio-output",
        "penalty-out-of-range",
        "n-zero",
        "truncate-prompt-tokens-zero",
        "stop-lone-surrogate",
        "prompt-lone-surrogate",
        "text-part-without-text",
        "content-an-object",
        "tool-call-id-not-a-string",
        "prompt-ids-out-of-vocab",
        "prompt-id-a-boolean",
        "top-k-negative",
        "stop-empty-string",
        "sagemaker-chat-unknown-role",
        "sagemaker-stop-lone-surrogate",
        "responses-lone-surrogate",
        "no-messages",
        "an-empty-prompt-in-a-list",
        "sagemaker-no-prompts",
        "content-part-type-unknown",
        "responses-part-in-a-chat-message",
        "regex-that-does-not-compile",
        "regex-that-does-not-compile-streamed",
        "grammar-that-does-not-compile",
        "schema-ref-to-nowhere",
        "forced-tool-schema-ref-to-nowhere",
        "responses-no-output-tokens",
        "responses-empty-input",
        "responses-schema-not-a-schema",
        "max-tokens-a-numeric-string",
        "stream-a-string",
        "temperature-a-boolean",
        "responses-output-limit-a-boolean",
        "sagemaker-chat-logprobs-a-number",
        "assistant-without-content-or-calls",
        "responses-forced-built-in-tool",
        "responses-image-to-text-model",
    ],
)
def test_openai_strict_cases_are_400_naming_the_field(server, path, body, param):
    """Where OpenAI answers 400, so does the service, naming the field (some by vLLM, the rest by
    service/server/openai_compat/request_checks/)."""
    error = assert_openai_error(post(server, path, json_body={"model": SERVED, "max_tokens": 2, **body}), 400)
    assert param in (error["param"] or ""), error


@pytest.mark.parametrize(
    ("path", "body", "skipped"),
    [
        (CHAT, {"messages": MSG, "web_search_options": {}}, "web_search_options"),
        ("/v1/responses", {"input": "hi", "tools": [{"type": "web_search"}, {"type": "file_search"}]}, "web_search"),
    ],
    ids=["web-search-options", "responses-hosted-tools"],
)
def test_hosted_tools_are_left_out_and_named_in_a_header(server, path, body, skipped):
    """What agents send by default (Codex CLI's web_search), served without it, as llama.cpp's server does."""
    resp = post(
        server,
        path,
        json_body={"model": SERVED, "max_tokens": 2, **body}
        if path == CHAT
        else {"model": SERVED, "max_output_tokens": 2, **body},
    )
    assert resp.status_code == 200, resp.text
    assert skipped in resp.headers["x-service-skipped-tools"]
    assert skipped in server.log()  # and logged


ANTHROPIC_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # vLLM answered each of these 200, or 500 for the stop sequence.
        ({"messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [*ANTHROPIC_HI, {"role": "assistant", "content": []}]}, "messages[1].content"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}, "tool_use_id"),
        ({"messages": ANTHROPIC_HI, "stop_sequences": ["\ud800"]}, "stop_sequences[0]"),
        ({"messages": ANTHROPIC_HI, "max_tokens": "4"}, "max_tokens"),
        ({"messages": ANTHROPIC_HI, "stream": "yes"}, "stream"),
    ],
)
def test_anthropic_strict_cases_are_400_in_anthropics_shape(server, body, param):
    """The Messages API in its own terms: what Anthropic's API refuses, with Anthropic's error shape."""
    response = post(server, "/v1/messages", json_body={"model": SERVED, "max_tokens": 2, **body})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert param in error["error"]["message"], error


def test_detokenize_still_answers_ids_inside_the_vocabulary(server):
    ids = post(server, "/tokenize", json_body={"model": SERVED, "prompt": "hello world"}).json()["tokens"]
    resp = post(server, "/detokenize", json_body={"model": SERVED, "tokens": ids})
    assert resp.status_code == 200 and resp.json()["prompt"].strip() == "hello world", resp.text


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("max_tokens", [0, -1])
def test_max_tokens_not_positive_is_400_naming_the_limit(server, path, max_tokens):
    body = {
        "model": SERVED,
        "max_tokens": max_tokens,
        **({"prompt": "hi"} if path == COMPLETIONS else {"messages": MSG}),
    }
    error = assert_openai_error(post(server, path, json_body=body), 400)
    assert error["param"] == "max_tokens"
    assert re.search(r"max_tokens must be at least 1, got -?\d+", error["message"]), error


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_max_tokens_beyond_context_is_served_up_to_what_fits_and_says_so(server, path):
    """As llama.cpp's server and Ollama do (Claude Code asks for 32,000 tokens whatever the model): vLLM refused it."""
    ids = [5] * (MAX_MODEL_LEN - 40)
    prompt = {"prompt": ids} if path == COMPLETIONS else {"messages": [{"role": "user", "content": "hi " * 300}]}
    body = {"model": SERVED, "max_tokens": 100_000, "ignore_eos": True, **prompt}
    resp = post(server, path, json_body=body)
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    assert (
        "100000" in resp.headers["x-service-max-tokens"] and str(MAX_MODEL_LEN) in resp.headers["x-service-max-tokens"]
    )


def test_max_tokens_past_the_room_left_is_clamped_to_the_context(server):
    """vLLM 0.32's documented behaviour: prompt + max_tokens over max_model_len (max_tokens itself within
    it) generates up to the end of the context; the usage shows exactly that."""
    ids = [5] * (MAX_MODEL_LEN - 50)
    resp = post(server, COMPLETIONS, json_body={"model": SERVED, "prompt": ids, "max_tokens": 200, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    assert usage["prompt_tokens"] == MAX_MODEL_LEN - 50
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN
    assert resp.json()["choices"][0]["finish_reason"] == "length"


def test_prompt_longer_than_context_is_400_naming_both_numbers(server):
    # Token ids: the exact length is known and named.
    too_long = MAX_MODEL_LEN + 44
    resp = post(server, COMPLETIONS, json_body={"model": SERVED, "prompt": [5] * too_long, "max_tokens": 2})
    error = assert_openai_error(resp, 400)
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"], error
    assert f"contains {too_long} input tokens" in error["message"], error
    # Text: vLLM never tokenizes more than max_model_len + 1 tokens of it (no unbounded work for a huge
    # prompt): it names the limit and the count it reached, or the characters when far over any bound.
    for path, words, expected in [
        (COMPLETIONS, MAX_MODEL_LEN * 3 // 4, f"contains at least {MAX_MODEL_LEN + 1} input tokens"),
        (CHAT, MAX_MODEL_LEN * 3 // 4, f"contains at least {MAX_MODEL_LEN + 1} input tokens"),
        (COMPLETIONS, MAX_MODEL_LEN * 2, f"contains {MAX_MODEL_LEN * 2 * 12} characters"),
    ]:
        text = "hello world " * words
        body = {"model": SERVED, "max_tokens": 2}
        body.update({"prompt": text} if path == COMPLETIONS else {"messages": [{"role": "user", "content": text}]})
        error = assert_openai_error(post(server, path, json_body=body), 400)
        assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"], error
        assert expected in error["message"], error


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_unknown_model_is_404(server, path):
    body = {"model": "no-such-model", **({"prompt": "hi"} if path == COMPLETIONS else {"messages": MSG})}
    error = assert_openai_error(post(server, path, json_body=body), 404)
    assert "no-such-model" in error["message"]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT, "/tokenize"])
def test_invalid_utf8_is_400(server, path):
    content = (
        b'{"model": "demo-tiny-llama", "prompt": "\xff\xfe\xfd", "messages": [{"role": "user", "content": "\xc3\x28"}]}'
    )
    assert_openai_error(post(server, path, content=content), 400)


def test_more_sequences_than_admission_allows_is_400_not_503(server):
    """n beyond max_queued_requests can never be admitted: 400 naming both numbers, not a 503 to retry."""
    n = MAX_QUEUED + 1
    error = assert_openai_error(
        post(server, COMPLETIONS, json_body={"model": SERVED, "prompt": "hi", "max_tokens": 1, "n": n}), 400
    )
    assert f"needs {n} sequences" in error["message"] and f"at most {MAX_QUEUED}" in error["message"], error
    # Each prompt a completion lists needs its own n sequences.
    body = {"model": SERVED, "prompt": ["hi"] * 3, "max_tokens": 1, "n": 3}
    error = assert_openai_error(post(server, COMPLETIONS, json_body=body), 400)
    assert error["param"] == "prompt" and "needs 9 sequences" in error["message"], error


def test_a_chat_batch_is_checked_per_conversation_and_counted_by_them(server):
    """vLLM's /v1/chat/completions/batch: one sequence per conversation (more than admission allows: 400 naming
    messages, not vLLM's 503), and each conversation gets the chat checks."""
    batch = "/v1/chat/completions/batch"
    body = {"model": SERVED, "max_tokens": 1, "messages": [MSG] * (MAX_QUEUED + 1)}
    error = assert_openai_error(post(server, batch, json_body=body), 400)
    assert error["param"] == "messages" and f"needs {MAX_QUEUED + 1} sequences" in error["message"], error
    body["messages"] = [MSG, [{"role": "wizard", "content": "hi"}]]
    error = assert_openai_error(post(server, batch, json_body=body), 400)
    assert error["param"] == "messages[1][0].role", error
    body["messages"] = [MSG, MSG]
    resp = post(server, batch, json_body=body)
    assert resp.status_code == 200 and len(resp.json()["choices"]) == 2, resp.text


def test_unknown_route_method_and_engine_controls_answer_in_openai_shape(server):
    assert_openai_error(httpx.get(f"{server.url}/v1/nothing-here", headers=server.headers()), 404)
    assert_openai_error(httpx.get(f"{server.url}/v1/completions", headers=server.headers()), 405)
    assert_openai_error(httpx.post(f"{server.url}/v1/hardware", headers=server.headers()), 405)
    assert_openai_error(httpx.request("TRACE", f"{server.url}/metrics", headers=server.headers()), 405)
    # Cluster/operator controls of vLLM's app are not served to API clients.
    scale = post(server, "/scale_elastic_ep", json_body={"new_data_parallel_size": 2})
    assert_openai_error(scale, 404)
    # An endpoint of another task (embeddings from a generative model) says so.
    error = assert_openai_error(post(server, "/v1/embeddings", json_body={"model": SERVED, "input": "hi"}), 404)
    assert error["message"] == f"/v1/embeddings is not served: the model '{SERVED}' does not do its task", error


def _raw_request(server, head: bytes, body_part: bytes, timeout: float = 10) -> tuple[bytes, float]:
    """Send a request head and part of its body, never the rest; return what the server answered."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.process.port), timeout=timeout) as sock:
        sock.sendall(head + body_part)
        data = b""
        # The head, then as much body as it declares: the two may come in separate segments.
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _declared_length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data, time.monotonic() - start


def _declared_length(data: bytes) -> int:
    found = re.search(rb"(?im)^content-length:\s*(\d+)", data.partition(b"\r\n\r\n")[0])
    return int(found.group(1)) if found else 0


def test_body_over_limit_is_413_without_reading_it(server):
    auth = f"Authorization: Bearer {server.api_key}\r\n".encode()
    # Declared too large: answered from the headers, after 1 KiB of a 10 MB body.
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + auth
        + b"Content-Length: 10000000\r\n\r\n"
    )
    data, took = _raw_request(server, head, b"x" * 1024)
    assert data.startswith(b"HTTP/1.1 413"), data[:300]
    assert b'"code":413' in data and f"{MAX_REQUEST_BYTES} bytes".encode() in data, data[:600]
    assert took < 5
    # Chunked, no length: cut off once past the limit, though the body never ends.
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + auth
        + b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * 16384
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(2 * MAX_REQUEST_BYTES // len(piece)))
    data, took = _raw_request(server, head, chunks)  # no terminating 0-chunk: the body is never complete
    assert data.startswith(b"HTTP/1.1 413"), data[:300]
    assert took < 5
    # An honest Content-Length just over the limit, body sent in full: 413 too.
    resp = post(server, COMPLETIONS, content=b"{" + b" " * MAX_REQUEST_BYTES + b"}")
    assert_openai_error(resp, 413)


@pytest.mark.parametrize(
    "auth",
    [None, "Bearer wrong-key", "Bearer", "Basic {key}", "{key}", "Bearer {key}x", "bearer  {key} extra"],
    ids=["missing", "wrong", "empty", "basic-scheme", "no-scheme", "suffix", "extra-token"],
)
@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", COMPLETIONS),
        ("POST", CHAT),
        ("GET", "/v1/models"),
        ("GET", f"/v1/models/{SERVED}"),
        ("GET", "/v1/hardware"),
        ("POST", "/tokenize"),
        ("GET", "/openapi.json"),
        ("GET", "/ping"),
    ],
)
def test_missing_or_wrong_api_key_is_401(server, auth, method, path):
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth.format(key=server.api_key)
    body = {"model": SERVED, "prompt": "hi", "messages": MSG, "max_tokens": 1}
    resp = httpx.request(method, f"{server.url}{path}", headers=headers, json=body if method == "POST" else None)
    error = assert_openai_error(resp, 401)
    assert resp.headers.get("www-authenticate") == "Bearer"
    assert server.api_key not in resp.text and "API key" in error["message"]


def test_probes_and_version_need_no_key_and_the_key_opens_the_api(server):
    for path in ("/health", "/ready", "/version", "/metrics"):
        assert httpx.get(f"{server.url}{path}").status_code == 200, path
    resp = post(server, COMPLETIONS, json_body={"model": SERVED, "prompt": "hi", "max_tokens": 2})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1


def test_schema_covers_the_engine_routes(server):
    schema = httpx.get(f"{server.url}/openapi.json", headers=server.headers()).json()
    paths = set(schema["paths"])
    assert {"/health", "/ready", "/version", "/v1/hardware", "/metrics", "/v1/models", "/v1/models/{model}"} <= paths
    assert {COMPLETIONS, CHAT, "/tokenize", "/v1/responses"} <= paths
    assert "/scale_elastic_ep" not in paths
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


FUZZ_EXAMPLES = 25


def test_schemathesis_finds_no_server_error_and_only_openai_errors(server, tmp_path):
    """Every operation of /openapi.json, positive and negative data, FUZZ_EXAMPLES per operation, against the
    real engine: no 5xx (not_a_server_error), every error in the OpenAI shape (st_hooks.openai_error_shape)."""
    assert st_hooks.CONTEXT == MAX_MODEL_LEN  # the lengths the hook cuts are those the server would decode
    env = dict(os.environ, SCHEMATHESIS_HOOKS="tests.reliability.st_hooks", PYTHONPATH=str(REPO), NO_COLOR="1")
    report = tmp_path / "report"
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{server.url}/openapi.json",
        "-H",
        f"Authorization: Bearer {server.api_key}",
        "--checks",
        "not_a_server_error,openai_error_shape",
        "--phases",
        "examples,fuzzing",
        "--max-examples",
        str(FUZZ_EXAMPLES),
        "--seed",
        "20261121",
        "--workers",
        "2",
        # Health checks judge the data generator (slow on a loaded 2-core box), not the API.
        "--suppress-health-check",
        "all",
        "--request-timeout",
        "60",
        "--report",
        "junit",
        "--report-dir",
        str(report),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-12000:]
    summary = re.search(r"(\d+) generated, (\d+) passed", out)
    tested = re.search(r"Tested:\s+(\d+)", out)
    assert summary and tested, out[-3000:]
    generated, passed = int(summary.group(1)), int(summary.group(2))
    print(f"schemathesis: {tested.group(1)} operations, {generated} generated cases, {passed} passed")
    operations = sum(
        method in {"get", "post", "put", "patch", "delete"}
        for item in httpx.get(f"{server.url}/openapi.json", headers=server.headers()).json()["paths"].values()
        for method in item
    )
    assert int(tested.group(1)) == operations >= 15  # every operation the port serves was fuzzed
    assert generated >= 10 * operations and passed == generated
    # The server lived through it and still answers.
    assert httpx.get(f"{server.url}/ready").status_code == 200
