"""Models the way users have them, through the real start-up path: hub ids downloaded on first start (`serve`, `pull`)
with the pre-flight before the weights, GGUF quant tags, offline mode, and Ollama's store read in place. The hub is
a loopback server answering its routes from real files (tests/support/hub_server.py): this machine cannot reach it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service.facts.model import packaged_default_model_path
from service.models.demo_model import ensure_demo_model
from tests.support.gguf_models import relabelled, tiny_gguf
from tests.support.hub_server import COMMIT, HubServer
from tests.support.ollama_store import ollama_store
from tests.support.release import release
from tests.support.server import MODELS, REPO, service_env, start_service

SMOLLM2 = packaged_default_model_path()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    demo = ensure_demo_model(MODELS)
    for repo, architecture in (("acme/tiny", None), ("acme/unservable", "NoSuchModelForCausalLM")):
        (root / repo).mkdir(parents=True)
        for f in demo.iterdir():
            if f.is_file():
                (root / repo / f.name).symlink_to(f)
        if architecture:
            config = json.loads((demo / "config.json").read_text()) | {"architectures": [architecture]}
            (root / repo / "config.json").unlink()
            (root / repo / "config.json").write_text(json.dumps(config))
    (root / "acme/tiny-GGUF").mkdir(parents=True)  # a tiny llama file: converted in a second
    (root / "acme/tiny-GGUF/tiny-Q8_0.gguf").symlink_to(tiny_gguf(MODELS, "llama", "Q8_0"))
    (root / "acme/stablelm-GGUF").mkdir(parents=True)
    relabelled(tiny_gguf(MODELS, "llama", "Q8_0"), root / "acme/stablelm-GGUF/lm-Q8_0.gguf", "stablelm")
    server = HubServer(root)
    server.url = server.start()  # type: ignore[attr-defined]
    yield server
    server.stop()


def env_for(hub: HubServer, home: Path, **extra: str) -> dict[str, str]:
    env = service_env(home / "service-cache")
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home / "hf"), HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1")  # type: ignore[attr-defined]
    return env | extra


def service(*args: str, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def decisions(detect_json: str) -> dict[str, dict]:
    return {d["setting"]: d for d in json.loads(detect_json)["decisions"]}


def test_a_hub_checkpoint_is_pulled_once_then_found_offline(hub, tmp_path):
    env = env_for(hub, tmp_path)
    pulled = service("pull", "acme/tiny", env=env)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert "ready: acme/tiny" in pulled.stdout and "downloaded from acme/tiny@" in pulled.stdout
    assert len([p for p in hub.fetched(".safetensors") if "/acme/tiny/" in p]) == 1
    asked = len(hub.requests)
    detect = service("detect", "--model", "acme/tiny", "--json", env=env | {"HF_HUB_OFFLINE": "1"})
    assert detect.returncode == 0, detect.stdout[-3000:] + detect.stderr[-3000:]
    fetched = decisions(detect.stdout)["model.fetched"]
    assert "in the cache (offline)" in fetched["reason"] and len(hub.requests) == asked


def test_a_model_that_cannot_be_served_is_refused_before_its_weights(hub, tmp_path):
    pulled = service("pull", "acme/unservable", env=env_for(hub, tmp_path))
    assert pulled.returncode == 1 and "NoSuchModelForCausalLM" in pulled.stderr, pulled.stderr[-3000:]
    assert [p for p in hub.fetched(".safetensors") if "unservable" in p] == []
    assert [p for p in hub.fetched("config.json") if "unservable" in p]  # what it was refused on


def test_a_gguf_file_of_an_architecture_not_served_is_refused_on_its_header(hub, tmp_path):
    pulled = service("pull", "acme/stablelm-GGUF:Q8_0", env=env_for(hub, tmp_path))
    assert pulled.returncode == 1 and "'stablelm' file" in pulled.stderr, pulled.stderr[-3000:]
    asked = [rng for method, path, rng in hub.requests if method == "GET" and path.endswith("lm-Q8_0.gguf")]
    assert asked == ["bytes=0-1048575"]  # the header, not the file


def test_offline_without_the_model_in_the_cache_says_downloads_are_off(hub, tmp_path):
    pulled = service("pull", "acme/tiny", env=env_for(hub, tmp_path, HF_HUB_OFFLINE="1"))
    assert pulled.returncode == 1 and "downloads are off" in pulled.stderr, pulled.stderr[-3000:]


def test_a_gguf_tag_is_pulled_and_converted_and_a_missing_tag_lists_the_repos(hub, tmp_path):
    env = env_for(hub, tmp_path)
    missing = service("pull", "acme/tiny-GGUF:Q2_K", env=env)
    assert missing.returncode == 1 and "has: Q8_0" in missing.stderr, missing.stderr[-3000:]
    pulled = service("pull", "acme/tiny-GGUF:q8_0", env=env)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert "the file tagged q8_0" in pulled.stdout
    assert (tmp_path / "service-cache" / "models" / "gguf").is_dir()  # converted ahead of the start


def test_a_model_in_ollamas_store_is_served_where_it_lies(tmp_path):
    store = tmp_path / "ollama"
    blob = ollama_store(store, "smollm2", "135m", SMOLLM2)  # its digest the file's: the start checks it
    env = service_env(tmp_path / "service-cache") | {"OLLAMA_MODELS": str(store)}
    detect = service("detect", "--model", "ollama:smollm2:135m", "--json", env=env)
    assert detect.returncode == 0, detect.stdout[-3000:] + detect.stderr[-3000:]
    fetched = decisions(detect.stdout)["model.fetched"]
    assert fetched["value"] == str(blob) and "manifest" in fetched["reason"] and "served in place" in fetched["reason"]
    assert decisions(detect.stdout)["model.served_name"]["value"] == "smollm2:135m"
    absent = service("detect", "--model", "ollama:llama3", "--json", env=env)
    assert absent.returncode == 1 and "it has: registry.ollama.ai/library/smollm2/135m" in absent.stdout


def test_a_hub_id_is_downloaded_on_first_start_and_served(hub, tmp_path):
    env = env_for(hub, tmp_path)
    hub_env = {k: env[k] for k in ("HF_ENDPOINT", "HF_HOME", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_XET")}
    before = len(hub.fetched("/acme/tiny/resolve/" + COMMIT + "/model.safetensors"))
    hub.slow["model.safetensors"] = 4.0  # a download long enough to be seen from outside
    try:
        server = start_service(tmp_path / "hub.log", name="hub", model="acme/tiny", extra_env=hub_env)
    finally:
        hub.slow.clear()
    try:
        # while it downloaded, the port said so: /ready 503 with the progress (and /health 200, the same server), but
        # not which model: no key guards that port yet
        downloading = [body for status, body in server.ready_statuses if status == 503 and "downloading" in str(body)]
        assert any("%" in body["reason"] for body in downloading), server.ready_statuses[:5]
        assert not any("acme" in str(body) for _, body in server.ready_statuses), server.ready_statuses[:5]
        models = httpx.get(f"{server.url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["acme/tiny"]
        answer = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": "acme/tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0},
            timeout=120,
        )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        hardware = httpx.get(f"{server.url}/v1/hardware", timeout=30).json()
        fetched = next(d for d in hardware["decisions"] if d["setting"] == "model.fetched")
        assert fetched["reason"].startswith("acme/tiny@") or "downloaded from acme/tiny@" in fetched["reason"]
        # the first process downloads; the service then runs again with its preload and finds it in the cache
        assert "downloaded from acme/tiny@" in (tmp_path / "hub.log").read_text()
        assert len(hub.fetched("/acme/tiny/resolve/" + COMMIT + "/model.safetensors")) == before + 1
    finally:
        release(server)
