"""LoRA adapters on the real engine: the demo model (fp32, so a batch's make-up cannot flip a near-tie) served with two
random adapters. Each is a model of its own to clients, and a batch that mixes them with the base model gives every
request what it gets alone: vLLM 0.32's CPU LoRA ops gave base-model requests batched with an adapter's that
adapter's delta (service/lora_rows.py: before the fix, 11 of 12 such base requests changed)."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest

from tests.integration.conftest import _start
from tests.support.lora import make_adapter
from tests.support.release import release
from tests.support.server import process_states

pytestmark = pytest.mark.engine

BASE = "demo-tiny-llama"
ADAPTERS = ("sql", "poet")
PROMPTS = ("The weather today is", "Once upon a time", "My favourite food")


@pytest.fixture(scope="module")
def lora_server(server_logs, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    adapters = {name: make_adapter(root / name, seed=i) for i, name in enumerate(ADAPTERS)}
    listed = ",".join(f"{name}={path}" for name, path in adapters.items())
    server = _start("lora", server_logs, BASE, dtype="float32", lora_adapters=listed)
    yield server, adapters
    release(server.process)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _tokens(client: openai.OpenAI, model: str, prompt: str) -> list[str]:
    out = client.completions.create(model=model, prompt=prompt, max_tokens=32, temperature=0, logprobs=1)
    return out.choices[0].logprobs.tokens


def test_each_adapter_is_a_model_clients_can_name(lora_server):
    server, adapters = lora_server
    listed = {card["id"]: card for card in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert set(listed) == {BASE, *ADAPTERS}
    for name, path in adapters.items():
        assert listed[name]["parent"] == BASE and listed[name]["root"] == str(path)
        assert "demo" not in listed[name], "the demo's description is the base model's"
        assert httpx.get(f"{server.url}/v1/models/{name}").json()["parent"] == BASE
    assert listed[BASE]["demo"] is True
    client = _client(server)
    texts = {m: _tokens(client, m, PROMPTS[0]) for m in (BASE, *ADAPTERS)}
    assert len({tuple(t) for t in texts.values()}) == 3, "each adapter changes the model's text"
    chat = client.chat.completions.create(
        model=ADAPTERS[0], messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert chat.model == ADAPTERS[0] and chat.usage.completion_tokens == 4
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="no-such-adapter", prompt="hi", max_tokens=2)
    assert unknown.value.body["message"].endswith(f"Valid aliases: {', '.join([BASE, *ADAPTERS])}.")


def test_a_batch_mixing_adapters_and_the_base_model_answers_each_as_alone(lora_server):
    server, _ = lora_server
    client = _client(server)
    jobs = [(model, prompt) for prompt in PROMPTS for model in (BASE, *ADAPTERS)]
    alone = {job: _tokens(client, *job) for job in jobs}
    changed: dict[str, int] = {}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        for _ in range(3):
            for job, tokens in zip(jobs, pool.map(lambda job: _tokens(client, *job), jobs), strict=True):
                changed[job[0]] = changed.get(job[0], 0) + (tokens != alone[job])
    print(f"requests whose text changed in a mixed batch, of {3 * len(PROMPTS)} each: {changed}")
    assert not any(changed.values()), changed


def test_the_decisions_and_every_vllm_process_show_the_lora_set_up(lora_server):
    server, adapters = lora_server
    decided = {d["setting"]: d for d in httpx.get(f"{server.url}/v1/hardware").json()["decisions"]}
    assert decided["engine.enable_lora"]["value"] is True
    assert decided["engine.max_loras"]["value"] == len(ADAPTERS)
    assert decided["engine.max_lora_rank"]["value"] == 8
    assert [m["name"] for m in decided["engine.lora_modules"]["value"]] == list(ADAPTERS)
    # Every vLLM process carried the fix out, read back from the running engine's log.
    states = process_states(server.process.log_path.read_text(errors="replace"))
    assert len(states) >= 3 and {s["lora_rows_fix"] for s in states} == {"applied"}, states
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'vllm:lora_requests_info{max_lora="2"' in metrics
    assert 'service_decision_info{setting="engine.max_loras",source="policy",value="2"}' in metrics
