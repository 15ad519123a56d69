"""The compose stack for real, with podman-compose (no Docker daemon, no registry): the api
service from the built default image (no SERVICE_TARGET chosen) and Prometheus from an image built
from Debian's package, both through a test-only override file (users' compose.yaml stays as it is). The override
also mounts the session's cache volume as the stack's cache: the stack's first start copies the service's kernels the
image was built with (for this CPU: the images are built here) and compiles the default model there once, and the
image tests' starts reuse both instead of doing it again.
The api runs the image `docker compose up` runs when the user chooses nothing (no target, no model): it must serve
the default model it ships and answer a question right, pick the live CPU's backend and its preload by itself, with
the preloaded libraries mapped by the engine processes, and run the service's kernels the image carries for this CPU;
Prometheus must see the api target up and scrape `vllm:*` metrics through the compose network; everything is brought
down (containers, network, its own volumes) afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

import pytest

from tests.support import engines

from .conftest import IMAGE, REPO, SCRIPTS, container_env, expected_backend, free_port, podman, tool
from .test_images import http, kernels_check, passed_on, preload_check

pytestmark = [pytest.mark.container, pytest.mark.timeout(3600)]

PROM_IMAGE = "localhost/cpu-llm-service-prometheus:debian"
# Generous: the stack's first start compiles the model, beside the host's tests (scripts/test.sh).
TIMEOUT = float(os.environ.get("CONTAINER_READY_TIMEOUT", "900"))


@pytest.fixture(scope="module")
def prometheus_image(tools):
    res = subprocess.run(
        ["bash", str(SCRIPTS / "prometheus-image.sh"), PROM_IMAGE],
        env=container_env(),
        text=True,
        capture_output=True,
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return PROM_IMAGE


def prom_query(base: str, query: str) -> list:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())["data"]["result"]


@pytest.fixture
def stack(images, prometheus_image, cache_volume, tmp_path):
    project = f"clstest{uuid.uuid4().hex[:8]}"
    key = tmp_path / "api_key"
    key.write_text("compose-test-key\n")
    key.chmod(0o644)
    grafana_password = tmp_path / "grafana_admin_password"
    grafana_password.write_text("compose-test-grafana\n")
    override = tmp_path / "compose.test.yaml"
    bind = "".join(f'\n      {k}: "{v}"' for k, v in passed_on().items())
    override.write_text(f"""\
services:
  api:
    environment:
      HF_HUB_OFFLINE: "1"{bind}
  prometheus:
    image: {prometheus_image}
volumes:
  hf-cache:
    external: true
    name: {cache_volume}
""")
    api_port, prom_port = free_port(), free_port()
    # No SERVICE_TARGET: compose.yaml picks its default image (built by the `images` fixture).
    env = {k: v for k, v in container_env().items() if k != "SERVICE_TARGET"}
    env |= {
        "SERVICE_IMAGE": IMAGE,
        "API_ADDRESS": "127.0.0.1",
        "API_PORT": str(api_port),
        "PROMETHEUS_ADDRESS": "127.0.0.1",
        "PROMETHEUS_PORT": str(prom_port),
        "API_KEY_FILE": str(key),
        "GRAFANA_PASSWORD_FILE": str(grafana_password),
        # Exercise the optional limits: the service sizes itself to them.
        "API_MEM_LIMIT": "8g",
        "API_SHM_SIZE": "1gb",
    }
    compose = [tool("podman-compose"), "-p", project, "-f", str(REPO / "compose.yaml"), "-f", str(override)]

    def run(*args, check=True, timeout=600):
        res = subprocess.run([*compose, *args], env=env, cwd=REPO, text=True, capture_output=True, timeout=timeout)
        if check:
            assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        return res

    try:
        engines.started("compose")
        run("up", "-d")
        yield {
            "project": project,
            "api": f"http://127.0.0.1:{api_port}",
            "prometheus": f"http://127.0.0.1:{prom_port}",
            "run": run,
        }
    finally:
        run("down", "-v", "-t", "30", check=False, timeout=300)
        left = podman("ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={project}", check=False)
        if left.stdout.split():
            podman("rm", "-f", *left.stdout.split(), check=False)
        for net in podman(
            "network", "ls", "-q", "--filter", f"label=io.podman.compose.project={project}", check=False
        ).stdout.split():
            podman("network", "rm", "-f", net, check=False)
        for vol in podman(
            "volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={project}", check=False
        ).stdout.split():
            podman("volume", "rm", "-f", vol, check=False)


def api_container(project: str) -> str:
    found = podman(
        "ps",
        "-q",
        "--filter",
        f"label=io.podman.compose.project={project}",
        "--filter",
        "label=com.docker.compose.service=api",
    ).stdout.split()
    assert len(found) == 1, found
    return found[0]


def test_compose_stack_prometheus_scrapes_api(stack, host_report):
    deadline = time.monotonic() + TIMEOUT
    up, ready, vllm_names, last_err = None, None, [], None
    while time.monotonic() < deadline:
        try:
            up = prom_query(stack["prometheus"], 'up{job="cpu-llm-service"}')
            # vLLM's metrics exist from the engine's construction on, before the warm-up: a scrape then found them
            # while the API still answered 503 "service is starting". The service's own gauge says when it is ready.
            ready = prom_query(stack["prometheus"], 'service_ready{job="cpu-llm-service"}')
            if up and up[0]["value"][1] == "1" and ready and ready[0]["value"][1] == "1":
                with urllib.request.urlopen(f"{stack['prometheus']}/api/v1/label/__name__/values", timeout=10) as r:
                    vllm_names = [n for n in json.loads(r.read())["data"] if n.startswith("vllm:")]
                if vllm_names:
                    break
        except OSError as err:
            last_err = err
        time.sleep(5)
    logs = stack["run"]("logs", "--tail", "60", check=False)
    assert up and up[0]["value"][1] == "1", f"api target not up in Prometheus: {up} {last_err}\n{logs.stdout[-4000:]}"
    assert ready and ready[0]["value"][1] == "1", f"service_ready not 1 in Prometheus: {ready}\n{logs.stdout[-4000:]}"
    assert vllm_names, f"no vllm:* metric in Prometheus\n{logs.stdout[-4000:]}"
    # The scrape went through the compose network to the service name.
    assert up[0]["metric"]["instance"] == "api:8000"
    # The alert rules are loaded.
    with urllib.request.urlopen(f"{stack['prometheus']}/api/v1/rules", timeout=10) as r:
        rules = [rule["name"] for g in json.loads(r.read())["data"]["groups"] for rule in g["rules"]]
    assert "LLMEngineDown" in rules and "LLMHighTimeToFirstToken" in rules
    # The API itself answers on its published port, with the key from the secret file, and only with it.
    key = "compose-test-key"
    status, body = http("GET", f"{stack['api']}/v1/models", key=key)
    assert status == 200, body
    assert http("GET", f"{stack['api']}/v1/models", key="wrong-key")[0] == 401
    # compose puts /metrics and /version behind the key too: Prometheus scraped above with the secret file.
    for path in ("/metrics", "/version"):
        assert http("GET", f"{stack['api']}{path}", key=None)[0] == 401, path
        assert http("GET", f"{stack['api']}{path}", key=key)[0] == 200, path
    models = json.loads(body)["data"]
    # With no model in .env, the default model the image ships: SmolLM2-135M-Instruct from its GGUF file.
    assert [(m["id"], m["source"]["format"]) for m in models] == [("SmolLM2-135M-Instruct", "gguf")], models
    status, body = http(
        "POST",
        f"{stack['api']}/v1/chat/completions",
        {"model": models[0]["id"], "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        | {"max_tokens": 16, "temperature": 0},
        timeout=120,
        key=key,
    )
    assert status == 200 and "Paris" in json.loads(body)["choices"][0]["message"]["content"], body
    # The memory limit from compose reached the service's startup decisions.
    status, body = http("GET", f"{stack['api']}/v1/hardware", key=key)
    assert status == 200, body
    hw = json.loads(body)
    assert hw["hardware"]["memory_limit_bytes"] == 8 * 1024**3, hw["hardware"]
    # With no target chosen, the default image runs the backend the host's own detection picks (zen on an
    # AMD EPYC) and preloads tcmalloc and that backend's OpenMP runtime into the engine processes.
    assert hw["backend"]["name"] == expected_backend(hw, host_report), (hw["backend"], host_report["backend"])
    assert hw["hardware"]["vendor"] == host_report["hardware"]["vendor"]
    preload = next(d for d in hw["decisions"] if d["setting"] == "env.LD_PRELOAD")
    openmp = "libgomp" if hw["backend"]["name"] == "zen" else "libiomp5"
    assert preload["source"] == "policy" and "libtcmalloc" in preload["value"] and openmp in preload["value"], preload
    name = api_container(stack["project"])
    libraries = preload_check(name, hw)
    assert any(os.path.basename(p).startswith(openmp) for p in libraries), libraries
    kernels_check(name, hw)
    # The default model is a GGUF file: llama.cpp, built from the image's source beside the kernels, scored it.
    assert (hw.get("gguf_check") or {}).get("passed") is True, hw.get("gguf_check")
    log = podman("logs", name, check=False)
    assert "libtcmalloc is not found in LD_PRELOAD" not in log.stdout + log.stderr
    # The stack's first start on the volume: the image's build for this CPU copied, no build at start.
    assert "copied the service's kernels the image was built with" in log.stdout + log.stderr
    assert "building the service's kernels" not in log.stdout + log.stderr
