"""OpenAI's Responses API (vLLM's /v1/responses) through the official `openai` SDK on the real default model
(SmolLM2, as `make serve` runs it): plain input, instructions, a stream, a function tool named or required and the
turn that passes its output back; and what vLLM keeps no store for, said as such."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.engine
MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK_WEATHER = "What is the weather like in Paris today?"


@pytest.fixture(scope="module")
def client(default_server):
    return openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_plain_input_answers_right(client):
    response = client.responses.create(
        model=MODEL, input="What is the capital of France?", temperature=0, max_output_tokens=40
    )
    assert response.status == "completed" and "Paris" in response.output_text
    assert response.usage.input_tokens > 5 and 0 < response.usage.output_tokens <= 40


def test_instructions_are_followed(client):
    response = client.responses.create(
        model=MODEL,
        instructions="You are a helpful assistant. Answer with one word.",
        input="What is the capital of Japan?",
        temperature=0,
        max_output_tokens=40,
    )
    assert "Tokyo" in response.output_text


def test_a_streamed_response_sends_its_text_and_completes(client):
    with client.responses.stream(model=MODEL, input="What is 2 + 2?", temperature=0, max_output_tokens=40) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_response()
    assert events[0] == "response.created" and events[-1] == "response.completed", events
    assert "response.output_text.delta" in events and "4" in final.output_text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_function_call_and_the_turn_that_returns_its_output(client, choice):
    first = client.responses.create(
        model=MODEL, input=ASK_WEATHER, tools=[WEATHER], tool_choice=choice, temperature=0, max_output_tokens=60
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    follow_up = client.responses.create(
        model=MODEL,
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=40,
        input=[
            {"role": "user", "content": ASK_WEATHER},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"},
        ],
    )
    # SmolLM2 may talk on past the limit ("incomplete"); a text answer is what the returned output must give.
    assert follow_up.status in ("completed", "incomplete") and follow_up.output_text.strip()


def test_what_vllm_keeps_no_store_for_is_said_as_such(client):
    """vLLM stores responses only with VLLM_ENABLE_RESPONSES_API_STORE, which keeps them in memory for good."""
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    for call in (
        lambda: client.responses.retrieve(response.id),
        lambda: client.responses.cancel(response.id),
        lambda: client.responses.create(model=MODEL, input="And?", previous_response_id=response.id),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert "stores no responses" in missing.value.message and "input" in missing.value.message


def test_codex_clis_hosted_and_namespace_tools_are_served_without_the_hosted_one(client):
    """What Codex CLI sends with every request: function tools, a namespace group, and OpenAI's hosted web_search.
    The hosted tool is left out (the header says so); the rest reach the model."""
    tools = [
        WEATHER,
        {"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [WEATHER | {"name": "spawn"}]},
        {"type": "web_search"},
    ]
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="What is the capital of France?", tools=tools, temperature=0, max_output_tokens=40
    )
    assert raw.headers["x-service-skipped-tools"].startswith("web_search"), raw.headers
    assert raw.parse().status == "completed"
