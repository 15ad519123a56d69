"""Anthropic's Messages API through the official `anthropic` SDK on the real default model (SmolLM2, as `make serve`
runs it), and its refusals in Anthropic's error shape: the service's own (the key, a foreign Host, the body limit)
and vLLM's, where vLLM's router passed OpenAI's type names through."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.integration.conftest import API_KEY

pytestmark = pytest.mark.engine
MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# The anthropic SDK (2.x) has no `temperature` argument any more; vLLM's Messages API still takes it in the body.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(default_server):
    return anthropic.Anthropic(base_url=default_server.url, api_key="unused", max_retries=0, timeout=120)


def test_a_plain_message_answers_right_with_usage(client):
    reply = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.model == MODEL
    assert "Paris" in reply.content[0].text and reply.stop_reason == "end_turn"
    assert reply.usage.input_tokens > 5 and 0 < reply.usage.output_tokens <= 40


def test_a_system_prompt_is_followed(client):
    reply = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        system="You are a helpful assistant. Answer with one word.",
        messages=[{"role": "user", "content": "What is the capital of Japan?"}],
    )
    assert "Tokyo" in reply.content[0].text


def test_a_system_message_mid_conversation_is_taken_as_claude_code_sends_it(client):
    """Claude Code 2.1 puts system messages into `messages` (vLLM's protocol takes them); the strict checks refused
    every one of its requests until they did too."""
    reply = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        messages=[
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "system", "content": "Answer in one sentence."},  # type: ignore[list-item,typeddict-item]
        ],
    )
    # answered (the 135 M model's words after a trailing system message are its own business)
    assert reply.content[0].text.strip() and reply.stop_reason in ("end_turn", "max_tokens")


def test_a_streamed_message_carries_every_event_the_sdk_parses(client):
    with client.messages.stream(
        model=MODEL, max_tokens=40, extra_body=GREEDY, messages=[{"role": "user", "content": "What is 2 + 2?"}]
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    for kind in ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
        assert kind in events, events
    assert events[0] == "message_start" and events[-1] == "message_stop", events
    assert "4" in final.content[0].text and final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_max_tokens_and_stop_sequences_say_why_they_stopped(client):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    cut = client.messages.create(model=MODEL, max_tokens=3, extra_body=GREEDY, messages=question)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    full = client.messages.create(model=MODEL, max_tokens=60, extra_body=GREEDY, messages=question).content[0].text
    word = "France"  # the greedy answer ("The capital of France is Paris.") names it, and goes on after it
    assert word in full and not full.rstrip(" .").endswith(word), full
    stopped = client.messages.create(
        model=MODEL, max_tokens=60, extra_body=GREEDY, messages=question, stop_sequences=[word]
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word, (full, stopped)
    assert word not in stopped.content[0].text and full.startswith(stopped.content[0].text)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_a_forced_tool_use_carries_parsed_input_and_then_takes_its_result(client, choice):
    reply = client.messages.create(
        model=MODEL, max_tokens=60, extra_body=GREEDY, messages=ASK_WEATHER, tools=[WEATHER], tool_choice=choice
    )
    (use,) = [block for block in reply.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and reply.stop_reason == "tool_use"
    # The tool's result goes back in a user turn; the model answers from it.
    after = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        tools=[WEATHER],
        messages=[
            *ASK_WEATHER,
            {"role": "assistant", "content": reply.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]},
        ],
    )
    # SmolLM2 may talk on past the limit; a text answer is what a tool_result turn must give.
    assert after.stop_reason in ("end_turn", "max_tokens") and after.content[0].type == "text"
    assert after.content[0].text.strip()


def test_tool_choice_auto_is_accepted(client):
    """SmolLM2's template names no tool-call format vLLM parses: with `auto` it may answer in text (the plan's
    `engine.tool_call_parser` says so), but the request is served."""
    reply = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice={"type": "auto"},
    )
    assert reply.stop_reason in ("end_turn", "tool_use", "max_tokens") and reply.content


def test_count_tokens_counts_what_a_message_uses(client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    counted = client.messages.count_tokens(model=MODEL, messages=messages)
    used = client.messages.create(model=MODEL, max_tokens=1, messages=messages).usage.input_tokens
    assert counted.input_tokens == used


def _anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


def test_refusals_take_anthropics_shape_and_the_sdks_error_classes(client, default_server):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=-1, messages=[{"role": "user", "content": "hi"}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["error"]["type"] == "not_found_error"
    url = f"{default_server.url}/v1/messages"
    foreign = httpx.post(url, json={}, headers={"host": "rebound.attacker.example"}, timeout=30)
    _anthropic_error(foreign, 403, "permission_error")
    huge = httpx.post(url, content=b"x" * (5 << 20), headers={"content-type": "application/json"}, timeout=60)
    _anthropic_error(huge, 413, "request_too_large")
    # Every other route keeps OpenAI's shape.
    openai_shaped = httpx.post(f"{default_server.url}/v1/chat/completions", json={"model": MODEL}, timeout=30)
    assert openai_shaped.status_code == 400 and openai_shaped.json()["error"]["code"] == 400


def test_the_key_is_taken_as_x_api_key_and_its_absence_is_an_authentication_error(chat_server):
    keyed = anthropic.Anthropic(base_url=chat_server.url, api_key=API_KEY, max_retries=0, timeout=120)
    counted = keyed.messages.count_tokens(model=chat_server.served_model, messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens > 0
    wrong = anthropic.Anthropic(base_url=chat_server.url, api_key="not-the-key-0123456789", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.count_tokens(model=chat_server.served_model, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "authentication_error"


def test_claude_codes_output_budget_is_served_up_to_what_fits(client):
    """Claude Code asks for 32,000 tokens whatever the model: more than SmolLM2's context (8,192), which vLLM
    refused. Served up to what fits, the header says so, the answer ends where the model does."""
    raw = client.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=32000,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_body=GREEDY,
    )
    assert "32000" in raw.headers["x-service-max-tokens"], raw.headers
    message = raw.parse()
    assert message.stop_reason == "end_turn" and "Paris" in message.content[0].text
