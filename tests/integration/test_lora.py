"""LoRA adapters on the real engine: the demo model (fp32, so a batch's make-up cannot flip a near-tie) served with two
random adapters. Each is a model of its own to clients, and a batch that mixes them with the base model gives every
request what it gets alone: vLLM 0.32's CPU LoRA ops gave base-model requests batched with an adapter's that
adapter's delta (service/in_vllm/lora_rows.py: before the fix, 11 of 12 such base requests changed). The same server has a
lora_dir: adapters are loaded from it and unloaded while it serves, each checked before vLLM sees it."""

from __future__ import annotations

import concurrent.futures
import shutil

import httpx
import openai
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.integration.conftest import _start
from tests.support.lora import make_adapter
from tests.support.release import release
from tests.support.server import forked, process_states

pytestmark = pytest.mark.engine

BASE = "demo-tiny-llama"
ADAPTERS = ("sql", "poet")
PROMPTS = ("The weather today is", "Once upon a time", "My favourite food")


@pytest.fixture(scope="module")
def lora_server(server_logs, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    adapters = {name: make_adapter(root / name, seed=i) for i, name in enumerate(ADAPTERS)}
    listed = ",".join(f"{name}={path}" for name, path in adapters.items())
    (root / "library").mkdir()
    server = _start("lora", server_logs, BASE, dtype="float32", lora_adapters=listed, lora_dir=str(root / "library"))
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
    # A slot for each adapter set at start and one that those loaded while serving share, sized for lora_max_rank.
    assert decided["engine.max_loras"]["value"] == len(ADAPTERS) + 1
    assert decided["engine.max_lora_rank"]["value"] == 16
    assert [m["name"] for m in decided["engine.lora_modules"]["value"]] == list(ADAPTERS)
    # Every vLLM process carried the fix out, read back from the running engine's log.
    states = process_states(server.process.log_path.read_text(errors="replace"))
    # A forked process holds its parent's fixed ops, and its plugin finds them in place.
    fixed = {s["pid"]: "already applied" if forked(s) else "applied" for s in states}
    assert len(states) >= 3 and {s["pid"]: s["lora_rows_fix"] for s in states} == fixed, states
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'vllm:lora_requests_info{max_lora="3"' in metrics
    assert 'service_decision_info{setting="engine.max_loras",source="policy",value="3"}' in metrics


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=120)


def _refused(response: httpx.Response, status: int, param: str | None, says: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["param"] == param and says in error["message"], error


def test_an_adapter_loaded_while_serving_answers_as_one_set_at_start_and_unloads(lora_server):
    server, adapters = lora_server
    library = adapters[ADAPTERS[0]].parent / "library"
    # The first adapter's files under another name: it must answer as the same adapter set at start does.
    shutil.copytree(adapters[ADAPTERS[0]], library / "team" / "sql-copy")
    client = _client(server)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: client.completions.create(model=BASE, prompt="x", max_tokens=64, temperature=0))
        loaded = _post(server, "/v1/load_lora_adapter", {"lora_name": "sql-copy", "lora_path": "team/sql-copy"})
        assert running.result().usage.completion_tokens == 64, "a request in flight is not disturbed by the load"
    assert loaded.status_code == 200, loaded.text
    card = loaded.json()
    assert (card["id"], card["parent"], card["root"], card["rank"]) == (
        "sql-copy",
        BASE,
        str(library / "team" / "sql-copy"),
        8,
    )
    listed = [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]
    assert listed == [BASE, *ADAPTERS, "sql-copy"], listed
    assert f"service_lora_adapters {len(ADAPTERS) + 1}.0" in httpx.get(f"{server.url}/metrics").text
    alone = {(m, p): _tokens(client, m, p) for p in PROMPTS for m in (BASE, "sql-copy")}
    assert all(alone["sql-copy", p] == _tokens(client, ADAPTERS[0], p) for p in PROMPTS)
    assert alone["sql-copy", PROMPTS[0]] != alone[BASE, PROMPTS[0]]
    # Batched with the base model from the shared slot, each answers as alone (the last slot's fix, lora_rows.py).
    with concurrent.futures.ThreadPoolExecutor(len(alone)) as pool:
        batched = dict(zip(alone, pool.map(lambda job: _tokens(client, *job), alone), strict=True))
    assert batched == alone
    _refused(
        _post(server, "/v1/load_lora_adapter", {"lora_name": "sql-copy", "lora_path": "team/sql-copy"}),
        400,
        None,
        "has already been loaded",
    )
    # A request already streaming from the adapter finishes with it, token for token, when it is unloaded.
    long = {
        "model": "sql-copy",
        "prompt": PROMPTS[1],
        "max_tokens": 128,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**long).choices[0].text
    stream = client.completions.create(**long, stream=True)
    streamed = [next(iter(stream)).choices[0].text]
    unloaded = _post(server, "/v1/unload_lora_adapter", {"lora_name": "sql-copy"})
    streamed += [chunk.choices[0].text for chunk in stream if chunk.choices]
    assert unloaded.status_code == 200 and unloaded.json()["deleted"] is True, unloaded.text
    assert "".join(streamed) == whole
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="sql-copy", prompt="hi", max_tokens=2)
    _refused(_post(server, "/v1/unload_lora_adapter", {"lora_name": "sql-copy"}), 404, None, "cannot be found")
    assert f"service_lora_adapters {len(ADAPTERS)}.0" in httpx.get(f"{server.url}/metrics").text
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_adapters_loaded_while_serving_share_their_slot_and_each_request_answers_as_alone(lora_server):
    server, adapters = lora_server
    library = adapters[ADAPTERS[0]].parent / "library"
    loaded = ("swap-a", "swap-b")
    for seed, name in enumerate(loaded, start=20):
        make_adapter(library / name, seed=seed)
        assert _post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": name}).status_code == 200
    client = _client(server)
    models = (BASE, *ADAPTERS, *loaded)
    jobs = [(model, prompt) for prompt in PROMPTS[:2] for model in models]
    alone = {job: _tokens(client, *job) for job in jobs}
    assert len({tuple(alone[m, PROMPTS[0]]) for m in models}) == len(models), "each adapter changes the text"
    # Four adapters and three slots: the two loaded while serving take turns in the shared one, inside one burst.
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        changed = [
            job
            for _ in range(2)
            for job, tokens in zip(jobs, pool.map(lambda job: _tokens(client, *job), jobs), strict=True)
            if tokens != alone[job]
        ]
    assert not changed, changed
    for name in loaded:
        assert _post(server, "/v1/unload_lora_adapter", {"lora_name": name}).status_code == 200
    assert [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]] == [BASE, *ADAPTERS]


def test_a_request_naming_an_adapter_of_lora_dir_loads_it_on_first_use(lora_server):
    server, adapters = lora_server
    library = adapters[ADAPTERS[1]].parent / "library"
    name = "team/poet-copy"  # a sub-directory: Hugging Face-style names with a slash
    shutil.copytree(adapters[ADAPTERS[1]], library / name)
    make_adapter(library / "wide-unloaded", seed=8, rank=32)
    client = _client(server)
    assert name not in [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]
    expected = _tokens(client, ADAPTERS[1], PROMPTS[0])

    def chat(_: int) -> int:
        out = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
        )
        return out.usage.completion_tokens

    # Six first requests at once, over two routes: each is served, and the adapter is loaded once.
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        completions = [pool.submit(_tokens, client, name, PROMPTS[0]) for _ in range(3)]
        chats = list(pool.map(chat, range(3)))
    assert [c.result() for c in completions] == [expected] * 3 and chats == [4] * 3
    log = server.process.log_path.read_text(errors="replace")
    assert log.count(f"loaded LoRA adapter {name!r}") == 1, "loaded once, by the first request"
    assert name in [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]
    # An adapter of lora_dir that cannot be served is refused naming `model`; names outside lora_dir are unknown.
    with pytest.raises(openai.BadRequestError) as wide:
        client.completions.create(model="wide-unloaded", prompt="hi", max_tokens=2)
    assert wide.value.body["param"] == "model" and "has rank 32" in wide.value.body["message"]
    for unknown in ("../sql", "nowhere", "team", f"./{name}", f"{name}/", str(adapters[ADAPTERS[0]])):
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=unknown, prompt="hi", max_tokens=2)
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": name}).status_code == 200
    assert [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]] == [BASE, *ADAPTERS]


def test_adapters_that_cannot_be_loaded_while_serving_are_refused_by_name(lora_server):
    server, adapters = lora_server
    library = adapters[ADAPTERS[0]].parent / "library"
    make_adapter(library / "wide", seed=5, rank=32)
    make_adapter(library / "other-model", seed=6, width=576, layers=30)
    (library / "empty").mkdir()
    # Outputs the model's layers do not have: only the engine finds that out, when it loads the weights.
    wrong_outputs = make_adapter(library / "wrong-outputs", seed=7)
    tensors = load_file(str(wrong_outputs / "adapter_model.safetensors"))
    save_file(
        {k: torch.zeros(300, v.shape[1]) if ".lora_B." in k else v for k, v in tensors.items()},
        str(wrong_outputs / "adapter_model.safetensors"),
    )
    load = "/v1/load_lora_adapter"
    refusals = [  # (lora_name, lora_path, the param named, what the message says)
        ("x", "../sql", "lora_path", "is not inside lora_dir"),
        ("x", str(adapters["sql"]), "lora_path", "not inside"),
        ("x", "nowhere", "lora_path", "is not a directory"),
        ("x", "empty", "lora_path", "has no adapter_config"),
        ("x", "wide", "lora_path", "has rank 32; this engine's adapter slots hold rank 16 (set lora_max_rank"),
        ("x", "other-model", "lora_path", "does not fit"),
        ("x", "wrong-outputs", "lora_path", "LoRA adapter 'x' could not be loaded: Call to add_lora method failed"),
        ("sql", "wide", "lora_name", "was set at start"),
        (" ", "wide", "lora_name", "lora_name is empty"),
        (None, "wide", "lora_name", ""),
        (BASE, "wide", "lora_name", "served model's own name"),
        ("x", "a" * 5000, "lora_path", "cannot be read"),
    ]
    for name, path, param, says in refusals:
        body = {"lora_path": path} | ({"lora_name": name} if name is not None else {})
        _refused(_post(server, load, body), 400, param, says)
    form = httpx.post(f"{server.url}{load}", data={"lora_name": "x", "lora_path": "wide"}, headers=server.headers())
    _refused(form, 400, None, "Only 'application/json' is allowed")
    _refused(_post(server, "/v1/unload_lora_adapter", {"lora_name": "sql"}), 400, "lora_name", "was set at start")
    # None of it reached the engine: it serves on, and the listing is what it was.
    listed = [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]
    assert listed == [BASE, *ADAPTERS], listed
    assert _tokens(_client(server), ADAPTERS[1], PROMPTS[0])


def test_without_a_lora_dir_loading_while_serving_is_off_and_says_how_to_turn_it_on(chat_server):
    response = _post(chat_server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "y"})
    _refused(response, 404, None, "set lora_dir (SERVICE_LORA_DIR)")
