"""Real builds and runs of every Dockerfile.cpu target with buildah/podman: no Docker daemon,
no registry (the Debian base image is built from Debian's archive first).

Each image is started offline, must turn /ready, answer a chat completion, and report on /v1/hardware and
/metrics the backend the host's own detection expects. The compose default image with no model configured (the
default model it ships, the live CPU's backend and preload picked by itself) is run by the compose stack's test
(test_compose.py), which starts first and builds the service's kernels for this CPU into the shared cache volume;
the generic image runs them from there. These images run the tiny demo model, eager (what they test is the image, not the
model; the compose stack's default image compiles its model); the Zen image on a non-AMD host must say why Zen acceleration is unavailable, and refuse cleanly when
`backend: zen` is forced.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager

import pytest

from service.kernels.build_at_start import WITH_THE_IMAGE
from service.kernels.registry import KERNELS
from service.models.demo_model import DEMO_NAME
from service.policy.linear.dense_kernel import OURS_BF16
from tests.support import engines

from .conftest import (
    DEFAULT_TARGET,
    IMAGE,
    REPO,
    TARGETS,
    ZENTORCH_TARGETS,
    build,
    build_output,
    expected_backend,
    free_port,
    podman,
)
from .test_static import METRIC_NAMES, dashboard_metric_names

pytestmark = [pytest.mark.container, pytest.mark.timeout(3600)]

API_KEY = "container-test-key"
READY_TIMEOUT = float(os.environ.get("CONTAINER_READY_TIMEOUT", "900"))
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def http(method: str, url: str, body: dict | None = None, timeout: float = 30, key: str | None = API_KEY):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@contextmanager
def running(
    image: str,
    volume: str,
    env: dict[str, str] | None = None,
    model: str = DEMO_NAME,
    engine: str = "image",
    eager: bool = True,
):
    """podman run -d on a loopback port, offline, with `model` ("": none configured, the image's default);
    always stopped and removed. `engine`: its family in tests/support/engines.py. Eager unless asked: what these
    runs check is the image, and the compose stack's default image compiles (a minute or more per backend saved)."""
    engines.started(f"{engine}/{image.rsplit(':', 1)[-1]}")
    name = f"cpu-llm-service-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    args = [
        "run",
        "-d",
        "--name",
        name,
        "--label",
        "cpu-llm-service-test=1",
        "-p",
        f"127.0.0.1:{port}:8000",
        "--shm-size",
        "1g",
        "--cap-add",
        "SYS_NICE",
        "-v",
        f"{volume}:/home/app/.cache",
        "-e",
        f"SERVICE_MODEL={model}",
        "-e",
        "HF_HUB_OFFLINE=1",
        "-e",
        f"SERVICE_API_KEY={API_KEY}",
    ]
    for k, v in (({"SERVICE_ENFORCE_EAGER": "true"} if eager else {}) | passed_on() | (env or {})).items():
        args += ["-e", f"{k}={v}"]
    podman(*args, image)
    try:
        yield name, f"http://127.0.0.1:{port}"
    finally:
        podman("stop", "-t", "30", name, check=False, timeout=90)
        podman("rm", "-f", name, check=False)


def passed_on() -> dict[str, str]:
    """The test run's own engine-thread binding (scripts/test.sh: the container tests compute on a core of their
    own), passed on to the service in a container as a user's would be."""
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    return {"VLLM_CPU_OMP_THREADS_BIND": bind} if bind else {}


def logs(name: str) -> str:
    res = podman("logs", name, check=False)
    return (res.stdout + res.stderr)[-8000:]


def wait_ready(name: str, base: str, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = podman("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name, check=False).stdout.split()
        if state and state[0] in ("exited", "stopped"):
            pytest.fail(f"{name} exited ({state}) before /ready:\n{logs(name)}")
        try:
            status, _ = http("GET", f"{base}/ready", timeout=5, key=None)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(3)
    pytest.fail(f"{name} not ready after {timeout:.0f} s:\n{logs(name)}")


def exported_names(metrics_text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in metrics_text.splitlines() if line and not line.startswith("#")}


def check_serving(name: str, base: str) -> dict:
    """/ready -> healthcheck -> chat completion -> /v1/hardware, /metrics. Returns hardware JSON."""
    wait_ready(name, base)
    # The image's own HEALTHCHECK (no systemd timers here: run it by hand), as the runtime judges it: unhealthy after
    # its retries (3) fail in a row. One run alone timed out (5 s) on a Zen 3 with both cores busy with engines.
    for _ in range(3):
        hc = podman("healthcheck", "run", name, check=False)
        if hc.returncode == 0:
            break
    assert hc.returncode == 0, f"healthcheck failed 3 times in a row: {hc.stdout}{hc.stderr}"

    status, body = http("GET", f"{base}/v1/models")
    assert status == 200, body
    model = json.loads(body)["data"][0]["id"]
    status, body = http("GET", f"{base}/v1/models", key="wrong-key")
    assert status == 401, f"API key not enforced: {status} {body}"
    status, body = http(
        "POST",
        f"{base}/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert status == 200, body
    chat = json.loads(body)
    assert chat["choices"][0]["message"]["content"] is not None
    assert chat["usage"]["completion_tokens"] > 0

    status, body = http("GET", f"{base}/v1/hardware")
    assert status == 200, body
    hardware = json.loads(body)

    status, metrics = http("GET", f"{base}/metrics", key=None)
    assert status == 200
    names = exported_names(metrics)
    assert any(n.startswith("vllm:") for n in names), "no vllm:* metric exported"
    assert f'backend="{hardware["backend"]["name"]}"' in metrics, "service_info does not name the backend"
    hardware["_metric_names"] = sorted(names)
    hardware["_metrics"] = metrics
    return hardware


def test_base_and_all_targets_build(images):
    for target in TARGETS:
        assert podman("image", "exists", f"{IMAGE}:{target}", check=False).returncode == 0


@pytest.mark.parametrize("target", TARGETS)
def test_image_metadata(images, target):
    info = json.loads(podman("image", "inspect", f"{IMAGE}:{target}").stdout)[0]
    cfg = info["Config"]
    labels = cfg["Labels"]
    assert labels["io.cpu-llm-service.version"] == PYPROJECT["project"]["version"]
    assert labels["io.cpu-llm-service.vllm.version"] == "0.32.0"
    assert labels["io.cpu-llm-service.torch.version"].startswith("2.13.0")
    assert labels["io.cpu-llm-service.zentorch.version"] == ("2.13.0.1" if target in ZENTORCH_TARGETS else "none")
    assert labels["io.cpu-llm-service.target"] == target
    assert cfg["User"].split(":")[0] not in ("", "0", "root")
    assert "8000/tcp" in cfg["ExposedPorts"]
    assert cfg["Entrypoint"] == ["python", "-m", "service", "serve"]
    assert "/ready" in " ".join(info.get("Healthcheck", {}).get("Test") or cfg.get("Healthcheck", {}).get("Test", []))
    # No fixed preload: the service decides it at start from the libraries it finds in the image.
    assert not any(e.startswith("LD_PRELOAD=") for e in cfg.get("Env") or []), cfg.get("Env")
    # The engine imports with the libraries the startup decision would preload (no loader warnings).
    res = podman(
        "run",
        "--rm",
        "--label",
        "cpu-llm-service-test=1",
        "--entrypoint",
        "python",
        f"{IMAGE}:{target}",
        "-c",
        "import os, subprocess, sys, json, importlib.metadata as m; "
        "r = json.loads(subprocess.run([sys.executable, '-m', 'service', 'detect', '--json'], "
        "check=True, capture_output=True, text=True).stdout); "
        "d = next(d for d in r['decisions'] if d['setting'] == 'env.LD_PRELOAD'); "
        "print(json.dumps(d)); "
        "p = subprocess.run([sys.executable, '-c', 'import torch, vllm'], capture_output=True, "
        "text=True, env=dict(os.environ, LD_PRELOAD=d['value'])); "
        "sys.stderr.write(p.stdout + p.stderr); assert p.returncode == 0; "
        "print(sorted(d.metadata['Name'] for d in m.distributions() "
        "if d.metadata['Name'] in ('torchvision', 'torchaudio', 'torchcodec', 'triton')))",
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cannot be preloaded" not in res.stderr, res.stderr
    decision = json.loads(res.stdout.splitlines()[-2])
    assert decision["source"] == "policy" and not decision["reason"].startswith("fallback"), decision
    assert "libtcmalloc_minimal" in decision["value"], decision
    assert res.stdout.splitlines()[-1] == "[]", "torchvision/torchaudio/torchcodec/triton must not be installed"


def preload_check(name: str, hw: dict) -> list[str]:
    """The preload decision on /v1/hardware, checked against the engine processes inside the container:
    every library it names is mapped by them. Returns the libraries."""
    decision = next(d for d in hw["decisions"] if d["setting"] == "env.LD_PRELOAD")
    assert decision["source"] == "policy" and decision["value"], decision
    libraries = decision["value"].split(":")
    # vLLM names its engine core and workers VLLM::EngineCore / VLLM::Worker...; none may lack a library (the
    # API server, PID 1, is not preloaded: it spawns them after the decision).
    script = (
        "import glob, json, os; libs = json.loads(os.environ['LIBS']); out = {}\n"
        "for d in glob.glob('/proc/[0-9]*'):\n"
        "    try: cmd, text = open(d + '/cmdline').read(), open(d + '/maps').read()\n"
        "    except OSError: continue\n"
        "    if cmd.startswith('VLLM::'): out[d + ' ' + cmd.strip(chr(0))] = [l for l in libs if os.path.realpath(l) not in text]\n"
        "print(json.dumps(out))"
    )
    res = podman("exec", "-e", f"LIBS={json.dumps(libraries)}", name, "python", "-c", script, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    missing = json.loads(res.stdout)
    assert len(missing) >= 2, f"expected the engine core and a worker: {missing}"
    assert not any(missing.values()), f"libraries not mapped: {missing}"
    return libraries


def kernels_check(name: str, hw: dict) -> None:
    """The service's kernels, built for this CPU with the image (the images are built on this machine) and copied into
    the cache volume at an image's first start on it (this start or an earlier one on the volume), are what its
    decisions found; where they run the dense layers, the engine did."""
    assert (hw["software"]["ggml_kernel"] or "").endswith(WITH_THE_IMAGE), hw["software"]
    assert not [d for d in hw["decisions"] if "not built" in d["reason"]], hw["decisions"]
    weights = next((d["value"] for d in hw["decisions"] if d["setting"] == "engine.linear_weights"), None)
    if weights in ("bf16", OURS_BF16):
        log = podman("logs", name, check=False)
        assert KERNELS["bf16-weights"].log_markers[0] in log.stdout + log.stderr, weights


@pytest.mark.compile_cache
def test_default_image_restarts_warm_from_the_cache_volume(images, cache_volume):
    """torch.compile's cache lives in the cache volume (VLLM_CACHE_ROOT under the service's cache dir): a restart
    loads the compiled model instead of compiling it again."""
    for _ in range(2):  # the first start may compile; the second must load what was saved
        with running(f"{IMAGE}:{DEFAULT_TARGET}", cache_volume, model="", engine="compile-cache", eager=False) as (
            name,
            base,
        ):
            wait_ready(name, base)
            log = podman("logs", name, check=False)
            log = log.stdout + log.stderr
    assert "Directly load AOT compilation from path /home/app/.cache/cpu-llm-service/vllm/" in log, log[-6000:]
    assert "building the service's kernels" not in log, log[-6000:]  # built once per CPU, in the volume
    assert "Compiling model again due to a load failure" not in log, log[-6000:]


def test_generic_image_serves(images, cache_volume, host_backend_without_zentorch, host_report):
    with running(f"{IMAGE}:vllm-openai", cache_volume) as (name, base):
        hw = check_serving(name, base)
        preload_check(name, hw)
        kernels_check(name, hw)
    # Without zentorch an AMD host gets the best generic backend, with the reason.
    assert hw["backend"]["name"] == host_backend_without_zentorch, hw["backend"]
    assert hw["hardware"]["vendor"] == host_report["hardware"]["vendor"]
    # The dashboard's and alert rules' metric names are all exported by a real instance.
    live = set(hw["_metric_names"])
    missing = dashboard_metric_names() - live - {"up"}
    assert not missing, f"dashboard uses metrics the service does not export: {sorted(missing)}"
    recorded = set(METRIC_NAMES.read_text().split())
    if os.environ.get("UPDATE_METRIC_NAMES"):
        METRIC_NAMES.write_text("\n".join(sorted(live)) + "\n")
    else:
        assert recorded <= live, f"{METRIC_NAMES.name} lists names no longer exported: {sorted(recorded - live)}"


def test_amx_image_serves(images, cache_volume, host_backend_without_zentorch):
    with running(f"{IMAGE}:vllm-openai-amx", cache_volume) as (name, base):
        hw = check_serving(name, base)
    # Falls back where AMX is absent; on an AMX host it is the AMX backend.
    assert hw["backend"]["name"] == host_backend_without_zentorch, hw["backend"]


def test_zen_image_serves_and_explains(images, cache_volume, host_report):
    with running(f"{IMAGE}:vllm-openai-zen", cache_volume) as (name, base):
        hw = check_serving(name, base)
        log = logs(name)
    # The demo model's first start calibrates: on a Zen host its tiny layers may run faster on vLLM's generic
    # kernels, and the report then says so (the reason names zen either way).
    assert hw["backend"]["name"] == expected_backend(hw, host_report), hw["backend"]
    if hw["backend"]["name"] != "zen":
        reason = hw["backend"]["reason"]
        assert "zen" in reason.lower(), reason
        assert "zen" in log.lower(), "the log must say why Zen acceleration is unavailable"
        assert 'backend="zen"' not in hw["_metrics"]


def test_zen_image_forced_zen_refuses_cleanly(images, cache_volume, host_report):
    if host_report["hardware"]["vendor"] == "AuthenticAMD":
        pytest.skip("forcing zen is valid on an AMD host")
    engines.started("image/forced-zen")
    name = f"cpu-llm-service-test-{uuid.uuid4().hex[:8]}"
    try:
        res = podman(
            "run",
            "--name",
            name,
            "--label",
            "cpu-llm-service-test=1",
            "-v",
            f"{cache_volume}:/home/app/.cache",
            "-e",
            f"SERVICE_MODEL={DEMO_NAME}",
            "-e",
            "HF_HUB_OFFLINE=1",
            "-e",
            "SERVICE_BACKEND=zen",
            # the key a deployment mounts: without it the start is refused for that first, before any backend
            "-e",
            f"SERVICE_API_KEY={API_KEY}",
            f"{IMAGE}:vllm-openai-zen",
            check=False,
            timeout=600,
        )
    finally:
        podman("rm", "-f", name, check=False)
    out = res.stdout + res.stderr
    assert res.returncode not in (0, 132, 128 + 4, -4), f"exit {res.returncode}:\n{out[-4000:]}"
    assert "zen" in out.lower() and "AMD" in out, out[-4000:]
    assert "Traceback" not in out, f"forced zen must fail with a clear error, not a traceback:\n{out[-4000:]}"


def test_unit_tests_pass_inside_the_image(images):
    """The `test` target runs the unit tests during its build."""
    build("test", IMAGE)


def test_rebuild_after_service_change_is_fast(images, tmp_path):
    """Layer caching: when service code changes, only the service layer and those after it are rebuilt. Checked on the
    builder's own account of each step, not on a time that a machine busy with other tests would blur."""
    ctx = tmp_path / "ctx"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for item in ("Dockerfile.cpu", ".dockerignore", "pyproject.toml", "README.md"):
        if (REPO / item).exists():
            shutil.copy2(REPO / item, ctx / item) if ctx.exists() else (
                ctx.mkdir(),
                shutil.copy2(REPO / item, ctx / item),
            )
    for item in ("service", "configs", "scripts", "tests"):
        shutil.copytree(REPO / item, ctx / item, ignore=ignore)
    with open(ctx / "service" / "__init__.py", "a") as fh:
        fh.write(f"\n# layer-cache probe {uuid.uuid4().hex}\n")
    tag = "localhost/cpu-llm-service-cachetest"
    try:
        seconds, output = build_output("vllm-openai", tag, context=ctx)
    finally:
        podman("rmi", "-f", f"{tag}:vllm-openai", check=False)
    print(f"\nrebuild after a service change: {seconds:.0f} s", file=sys.stderr)
    steps = rebuilt_steps(output)
    # The service's layer copies the whole package; the kernels stage before it copies a few of its files, not the
    # changed one, and stays cached.
    first = next(i for i, (step, _) in enumerate(steps) if step.startswith("COPY service/ "))
    assert steps[first][1], f"the changed service was not copied again: {steps}"
    assert not [step for step, rebuilt in steps[:first] if rebuilt], f"rebuilt before the service layer: {steps}"


def rebuilt_steps(output: str) -> list[tuple[str, bool]]:
    """(instruction, rebuilt) per step of every stage the build ran, in order, from buildah's output (a step it took
    from its cache is followed by "--> Using cache"; a FROM builds nothing)."""
    lines = output.splitlines()
    steps = []
    for i, line in enumerate(lines):
        if re.match(r"\[\d+/\d+\] STEP \d+/\d+: ", line):
            step = line.split(": ", 1)[1]
            cached = i + 1 < len(lines) and lines[i + 1].startswith("--> Using cache")
            steps.append((step, not cached and not step.startswith("FROM ")))
    return steps
