"""What agent frameworks send, through the official `openai` client: tool calls, structured outputs, reasoning.

Two real servers: the session's demo model (`chat_server`, no tool-call format: named and required tool_choice
only, grammar-forced) and a tiny Qwen3-style model (Qwen3 template, <think> and <tool_call> added tokens:
hermes tool calls, qwen3 reasoning) whose weights are set to write a scripted answer, since random weights
never write <think> or <tool_call> (tests/support/tiny_models.py `_scripted_qwen3_weights`).

vLLM 0.32 returns the thinking as `reasoning` (it renamed `reasoning_content`); the openai client (3.x) has no
typed field for it and keeps it as an extra attribute of the message / delta.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from tokenizers import Tokenizer

from service.models.demo_model import demo_dir
from tests.integration.conftest import _start
from tests.support.release import release
from tests.support.server import MODELS, REPO
from tests.support.tiny_models import (
    SCRIPT_ANSWER,
    SCRIPT_REASONING,
    tiny_llama31_chat,
    tiny_qwen3_chat,
)

QWEN = "tiny-qwen3-chat"
CITY = {"type": "string", "enum": ["Paris", "Rome"]}  # a closed set: random weights would write a string forever
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def qwen_server(server_logs):
    model = tiny_qwen3_chat(MODELS)
    server = _start("qwen3-chat", server_logs, QWEN, model=str(model), served_model_name=QWEN)
    yield server
    release(server.process)


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key or "unused", max_retries=0)


def token_ids(model_dir: Path, predicate) -> list[int]:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [i for text, i in tok.get_vocab().items() if predicate(tok.decode([i]), text)]


@pytest.fixture(scope="module")
def no_whitespace() -> dict[str, int]:
    """logit_bias banning the demo model's whitespace tokens. Grammar-forced JSON allows any whitespace between
    tokens, and random weights have nothing against writing it until max_tokens (a trained model does)."""
    ids = token_ids(demo_dir(MODELS), lambda decoded, _: decoded != "" and decoded.strip() == "")
    assert ids
    return {str(i): -100 for i in ids}


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning")


def stream(c: openai.OpenAI, **kw) -> dict:
    """Deltas of a streamed answer, gathered: content, reasoning, tool-call names and argument pieces."""
    out = {"content": "", "reasoning": "", "names": [], "arguments": {}, "finish": None, "chunks": 0}
    for chunk in c.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        out["chunks"] += 1
        delta = chunk.choices[0].delta
        out["content"] += delta.content or ""
        out["reasoning"] += reasoning_of(delta) or ""
        for call in delta.tool_calls or []:
            if call.function and call.function.name:
                out["names"].append(call.function.name)
            if call.function and call.function.arguments:
                out["arguments"].setdefault(call.index, []).append(call.function.arguments)
        out["finish"] = chunk.choices[0].finish_reason or out["finish"]
    return out


def assert_weather_call(name: str, arguments: str) -> None:
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


# ---------------------------------------------------------------------------------------------------------
# Demo model: no tool-call format of its own; named and required tool_choice are grammar-forced
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_demo_named_tool_call_parses_into_tool_calls(chat_server, no_whitespace):
    c = client(chat_server)
    kw = dict(
        model=chat_server.served_model,
        messages=ASK,
        tools=[WEATHER],
        tool_choice=NAMED,
        max_tokens=40,
        temperature=0,
        logit_bias=no_whitespace,
    )
    message = c.chat.completions.create(**kw).choices[0].message
    assert len(message.tool_calls) == 1
    assert_weather_call(message.tool_calls[0].function.name, message.tool_calls[0].function.arguments)
    streamed = stream(c, **kw)
    assert streamed["names"] == ["get_weather"]
    assert_weather_call("get_weather", "".join(streamed["arguments"][0]))


@pytest.mark.engine
def test_demo_required_tool_choice_calls_a_tool(chat_server, no_whitespace):
    # One call: `required` forces a JSON array of calls, and random weights would keep appending to it.
    c = client(chat_server)
    kw = dict(
        model=chat_server.served_model,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
        logit_bias=no_whitespace,
    )
    choice = c.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    assert_weather_call(choice.message.tool_calls[0].function.name, choice.message.tool_calls[0].function.arguments)
    streamed = stream(c, **kw)
    assert streamed["finish"] == "tool_calls" and streamed["names"] == ["get_weather"]
    assert_weather_call("get_weather", "".join(streamed["arguments"][0]))


@pytest.mark.engine
def test_demo_auto_tool_choice_answers_in_text(chat_server):
    """forced_only: the model has no format to call a tool in, so `auto` is a text answer (not a 400)."""
    c = client(chat_server)
    choice = c.chat.completions.create(
        model=chat_server.served_model, messages=ASK, tools=[WEATHER], max_tokens=5, temperature=0
    ).choices[0]
    assert not choice.message.tool_calls and choice.message.content


@pytest.mark.engine
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_demo_structured_outputs(chat_server, no_whitespace, streamed):
    c = client(chat_server)
    schema = {
        "type": "object",
        "properties": {"city": CITY, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    # json_object allows any object: random weights would add keys forever, so "}" is favoured (the grammar still
    # decides where it may go).
    close = token_ids(demo_dir(MODELS), lambda decoded, _: decoded == "}")
    formats = [
        ({"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}}, schema, {}),
        ({"type": "json_object"}, {"type": "object"}, {str(close[0]): 100}),
    ]
    for response_format, expected, favour in formats:
        kw = dict(
            model=chat_server.served_model,
            messages=ASK,
            response_format=response_format,
            max_tokens=60,
            temperature=0,
            logit_bias={**no_whitespace, **favour},
        )
        text = stream(c, **kw)["content"] if streamed else c.chat.completions.create(**kw).choices[0].message.content
        jsonschema.validate(json.loads(text), expected)


@pytest.mark.engine
def test_demo_schema_that_is_not_a_schema_is_a_400_naming_it(chat_server):
    with pytest.raises(openai.BadRequestError) as caught:
        client(chat_server).chat.completions.create(
            model=chat_server.served_model,
            messages=ASK,
            max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "flurb"}}},
        )
    assert caught.value.param == "response_format.json_schema.schema"
    assert '"flurb" is not valid' in caught.value.message  # jsonschema-rs's words for the meta-schema check


# ---------------------------------------------------------------------------------------------------------
# Qwen3-style model: hermes tool calls and qwen3 reasoning, chosen from its template
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_qwen3_style_policy_chose_hermes_and_qwen3(qwen_server):
    report = httpx.get(f"{qwen_server.url}/v1/hardware", headers=qwen_server.headers()).json()
    decided = {d["setting"]: d["value"] for d in report["decisions"]}
    assert decided["engine.tool_call_parser"] == "hermes" and decided["engine.enable_auto_tool_choice"] is True
    assert decided["engine.reasoning_parser"] == "qwen3"


@pytest.mark.engine
def test_qwen3_style_auto_tool_call_and_reasoning(qwen_server):
    """The model writes <think>...</think><tool_call>{...}</tool_call>: auto tool choice parses the call, the
    reasoning parser takes the thinking out of the content."""
    c = client(qwen_server)
    kw = dict(model=QWEN, messages=ASK, tools=[WEATHER], max_tokens=40, temperature=0)
    choice = c.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert_weather_call(choice.message.tool_calls[0].function.name, choice.message.tool_calls[0].function.arguments)
    assert reasoning_of(choice.message) == SCRIPT_REASONING and not choice.message.content
    streamed = stream(c, **kw)
    assert streamed["finish"] == "tool_calls" and streamed["names"] == ["get_weather"]
    assert len(streamed["arguments"][0]) > 1  # the arguments arrive in pieces
    assert_weather_call("get_weather", "".join(streamed["arguments"][0]))
    assert streamed["reasoning"] == SCRIPT_REASONING and not streamed["content"].strip()


@pytest.mark.engine
@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_qwen3_style_forced_tool_calls(qwen_server, tool_choice):
    c = client(qwen_server)
    kw = dict(model=QWEN, messages=ASK, tools=[WEATHER], tool_choice=tool_choice, max_tokens=40, temperature=0)
    message = c.chat.completions.create(**kw).choices[0].message
    assert_weather_call(message.tool_calls[0].function.name, message.tool_calls[0].function.arguments)
    streamed = stream(c, **kw)
    assert streamed["names"] == ["get_weather"]
    assert_weather_call("get_weather", "".join(streamed["arguments"][0]))


@pytest.mark.engine
def test_qwen3_style_thinking_splits_from_the_answer(qwen_server):
    """Without tools, <tool_call> banned by logit_bias: the model's second choice after </think> is a text answer."""
    tool_call = token_ids(MODELS / "models" / "tiny-qwen3-chat-v1", lambda _, text: text == "<tool_call>")
    c = client(qwen_server)
    kw = dict(model=QWEN, messages=ASK, max_tokens=40, temperature=0, logit_bias={str(tool_call[0]): -100})
    message = c.chat.completions.create(**kw).choices[0].message
    assert (reasoning_of(message), message.content) == (SCRIPT_REASONING, SCRIPT_ANSWER)
    streamed = stream(c, **kw)
    assert (streamed["reasoning"], streamed["content"]) == (SCRIPT_REASONING, SCRIPT_ANSWER)


# ---------------------------------------------------------------------------------------------------------
# Policy on built model directories, no engine
# ---------------------------------------------------------------------------------------------------------


def detect(model: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "service", "detect", "--model", str(model), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    return {d["setting"]: d["value"] for d in json.loads(out)["decisions"]}


def test_llama31_style_model_gets_llama3_json_tool_calls():
    decided = detect(tiny_llama31_chat(MODELS))
    assert decided["engine.tool_call_parser"] == "llama3_json"
    assert decided["engine.enable_auto_tool_choice"] is True and decided["engine.reasoning_parser"] is None
