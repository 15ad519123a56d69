"""The OpenAI API through the official `openai` client against the real service and engine."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def client(chat_server):
    return openai.OpenAI(base_url=f"{chat_server.url}/v1", api_key=chat_server.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def aclient(chat_server):
    return openai.AsyncOpenAI(base_url=f"{chat_server.url}/v1", api_key=chat_server.api_key, max_retries=0, timeout=120)


MESSAGES = [{"role": "user", "content": "Say something about the cache."}]


def test_list_models_marks_the_demo(client, chat_server):
    models = client.models.list().data
    assert [m.id for m in models] == [chat_server.served_model]
    assert models[0].model_extra["demo"] is True and "demo" in models[0].model_extra["description"]


def test_retrieve_model_returns_the_served_card_and_404_for_any_other(client, chat_server):
    card = client.models.retrieve(chat_server.served_model)
    assert card.id == chat_server.served_model and card.model_extra["demo"] is True
    listed = client.models.list().data[0]
    per_call = {"created", "permission"}  # the time of the call, and a permission id made per call
    assert card.model_dump(exclude=per_call) == listed.model_dump(exclude=per_call)
    # A Hugging Face id holds a slash: still this route, still the OpenAI error shape.
    for other in ("gpt-4o", "Qwen/Qwen3-0.6B"):
        with pytest.raises(openai.NotFoundError) as err:
            client.models.retrieve(other)
        error = err.value.body
        assert error["param"] == "model" and f"`{other}` does not exist" in error["message"], error
        assert chat_server.served_model in error["message"]


def test_completion_honours_max_tokens(client, chat_server):
    out = client.completions.create(model=chat_server.served_model, prompt="hello world", max_tokens=7, temperature=0)
    assert out.usage.completion_tokens == 7 and out.choices[0].finish_reason == "length"


def test_chat_completion(client, chat_server):
    out = client.chat.completions.create(model=chat_server.served_model, messages=MESSAGES, max_tokens=5, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.usage.completion_tokens == 5


def test_each_answer_names_its_request_as_openai_does(client, chat_server):
    """`x-request-id`, which the official client reads as `_request_id`: a new id the answer's own id is made of
    (the engine ran the request under it), or the client's X-Request-Id; error answers carry it too."""
    args = dict(model=chat_server.served_model, messages=MESSAGES, max_tokens=3, temperature=0)
    out = client.chat.completions.create(**args)
    assert out._request_id and out.id == f"chatcmpl-{out._request_id}", (out.id, out._request_id)
    again = client.chat.completions.create(**args)
    assert again._request_id != out._request_id
    mine = client.completions.create(
        model=chat_server.served_model, prompt="hi", max_tokens=2, extra_headers={"X-Request-Id": "trace-7"}
    )
    assert mine._request_id == "trace-7" and mine.id == "cmpl-trace-7"
    stream = client.chat.completions.with_raw_response.create(**args, stream=True)
    chunks = list(stream.parse())
    assert stream.headers["x-request-id"] and {c.id for c in chunks} == {f"chatcmpl-{stream.headers['x-request-id']}"}
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(**(args | {"model": "gpt-4o"}))
    assert err.value.request_id and err.value.response.headers["x-request-id"] == err.value.request_id


def test_streaming_usage_matches_non_streamed(client, chat_server):
    args = dict(model=chat_server.served_model, messages=MESSAGES, max_tokens=12, temperature=0)
    plain = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (plain.usage.prompt_tokens, plain.usage.completion_tokens)
    assert text == plain.choices[0].message.content


def test_n_greater_than_one(client, chat_server):
    out = client.chat.completions.create(model=chat_server.served_model, messages=MESSAGES, max_tokens=4, n=3, seed=1)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert out.usage.completion_tokens == 12


def test_stop_sequence_ends_generation(client, chat_server):
    first = client.completions.create(model=chat_server.served_model, prompt="the model", max_tokens=16, temperature=0)
    text = first.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2] or text[:1]
    assert stop.strip(), "the demo model produced whitespace only; pick another prompt"
    out = client.completions.create(
        model=chat_server.served_model, prompt="the model", max_tokens=16, temperature=0, stop=[stop]
    )
    assert out.choices[0].finish_reason == "stop" and stop not in out.choices[0].text
    assert out.choices[0].text == text[: text.index(stop)]


async def test_async_client_concurrent_requests(aclient, chat_server):
    import asyncio

    outs = await asyncio.gather(
        *[aclient.completions.create(model=chat_server.served_model, prompt=f"p{i}", max_tokens=3) for i in range(4)]
    )
    assert all(o.usage.completion_tokens == 3 for o in outs)
    models = await aclient.models.list()
    assert models.data[0].id == chat_server.served_model


def test_bad_request_is_openai_error_and_server_keeps_serving(client, chat_server):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=chat_server.served_model, prompt="x", max_tokens=-1)
    assert err.value.status_code == 400 and "max_tokens" in str(err.value.body)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    assert set(missing.value.body) >= {"message", "type", "code"}
    assert (
        client.completions.create(model=chat_server.served_model, prompt="ok", max_tokens=2).usage.completion_tokens
        == 2
    )


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-key"}, {"Authorization": "Basic dGVzdA=="}],
    ids=["none", "wrong", "scheme"],
)
def test_auth_rejects_missing_or_wrong_key_in_openai_format(chat_server, headers):
    resp = httpx.get(f"{chat_server.url}/v1/models", headers=headers)
    assert resp.status_code == 401
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["code"] == 401


def test_auth_accepts_the_right_key_and_leaves_probes_open(chat_server):
    assert httpx.get(f"{chat_server.url}/v1/models", headers=chat_server.headers()).status_code == 200
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{chat_server.url}{path}").status_code == 200


def test_openai_client_with_wrong_key_raises_authentication_error(chat_server):
    bad = openai.OpenAI(base_url=f"{chat_server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
