"""Shared helpers for the container tests.

Static tests (no marker) are fast: linting and validating Dockerfile.cpu, compose.yaml and the
Prometheus/Grafana configs. Tests marked `container` build and run the real images with
buildah/podman (no Docker daemon, no registry), as scripts/container/*.sh do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "container"
BIN = Path(sys.executable).parent
TARGETS = ("vllm-openai-auto", "vllm-openai", "vllm-openai-zen", "vllm-openai-amx")
ZENTORCH_TARGETS = ("vllm-openai-auto", "vllm-openai-zen")  # the images that carry zentorch
IMAGE = "localhost/cpu-llm-service"
# The image `docker compose up` runs when the user chooses nothing: compose.yaml's SERVICE_TARGET default.
DEFAULT_TARGET = re.search(r"target: \$\{SERVICE_TARGET:-([^}]+)\}", (REPO / "compose.yaml").read_text())[1]


def tool(name: str) -> str:
    """Path of a tool from the venv (pip-installed) or PATH; fail in CI, skip elsewhere."""
    for cand in (BIN / name, shutil.which(name)):
        if cand and Path(cand).exists():
            return str(cand)
    msg = f"{name} not installed (run `make container-tools`)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


_ENV: dict[str, str] | None = None


def container_env() -> dict[str, str]:
    """os.environ plus what scripts/container/env.sh exports (private storage and engine config)."""
    global _ENV
    if _ENV is None:
        out = subprocess.run(
            ["bash", "-c", f'. "{SCRIPTS / "env.sh"}" && env -0'],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        _ENV = dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)
        _ENV["PATH"] = f"{BIN}:{_ENV.get('PATH', '')}"
    return dict(_ENV)


def podman(*args: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args], env=container_env(), check=check, text=True, capture_output=True, timeout=timeout, **kw
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(target: str, image: str = IMAGE, context: Path = REPO) -> float:
    return build_output(target, image, context)[0]


def build_output(target: str, image: str = IMAGE, context: Path = REPO) -> tuple[float, str]:
    """(seconds, the builder's output) of a build that must succeed."""
    start = time.monotonic()
    res = subprocess.run(
        ["bash", str(context / "scripts/container/build.sh"), target, image],
        env=container_env(),
        cwd=context,
        text=True,
        capture_output=True,
        timeout=3000,
    )
    assert res.returncode == 0, f"build of {target} failed:\n{res.stdout[-6000:]}\n{res.stderr[-4000:]}"
    return time.monotonic() - start, res.stdout + res.stderr


@pytest.fixture(scope="session")
def tools():
    for t in ("buildah", "podman", "mmdebstrap"):
        tool(t)
    remove_leftovers()
    yield
    remove_leftovers()
    release_storage_mounts()


def remove_leftovers() -> None:
    """Remove what test runs leave in the shared container storage, before and after a session.

    An interrupted run leaves its containers, compose stack and volumes running. Every build of a
    changed tree leaves the previous image untagged (4-5 GB each), and a machine that runs CI
    again and again would fill its disk with them. Tagged images, and the build cache under
    them, stay."""
    for what, flt in (("ps", "label=cpu-llm-service-test"), ("ps", "name=^clstest")):
        left = podman(what, "-a", "-q", "--filter", flt, check=False).stdout.split()
        if left:
            podman("rm", "-f", "-t", "5", *left, check=False, timeout=300)
    for kind, flt in (
        ("network", "name=^clstest"),
        ("volume", "name=^clstest"),
        ("volume", "label=cpu-llm-service-test"),
    ):
        left = podman(kind, "ls", "-q", "--filter", flt, check=False).stdout.split()
        if left:
            podman(kind, "rm", "-f", *left, check=False)
    podman("image", "prune", "-f", check=False, timeout=900)


def release_storage_mounts() -> None:
    """containers/storage's overlay driver bind-mounts its own directory and keeps it mounted after
    podman exits; unmount it (and stale layer mounts) when nothing of ours uses the storage."""
    env = container_env()
    if podman("ps", "-q", check=False).stdout.strip():
        return
    if subprocess.run(["buildah", "containers", "-q"], env=env, capture_output=True, text=True).stdout.strip():
        return
    podman("image", "unmount", "--all", check=False)
    root = Path(env["CONTAINER_HOME"]) / "storage" / "overlay"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mnt in sorted((m for m in mounts if m == str(root) or m.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", mnt], capture_output=True)


@pytest.fixture(scope="session")
def images(tools):
    """Build the base image and every target once per session; returns target -> seconds."""
    times = {}
    res = subprocess.run(
        ["bash", str(SCRIPTS / "base-image.sh")], env=container_env(), text=True, capture_output=True, timeout=1800
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    # The kernels stage first, tagged: its layers are no final image's ancestors, so remove_leftovers' prune of
    # untagged images took them at every session's start and each run compiled the kernels again.
    for target in ("kernels", *TARGETS):
        times[target] = build(target)
    print(f"\nbuild times (s): {json.dumps({k: round(v) for k, v in times.items()})}", file=sys.stderr)
    return times


@pytest.fixture(scope="session")
def cache_volume(tools, after_the_unit_tests):
    """One writable cache volume for all runs: the demo model is generated into it once."""
    name = f"cpu-llm-service-test-cache-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", "--label", "cpu-llm-service-test=1", name)
    yield name
    podman("volume", "rm", "-f", name, check=False)


@pytest.fixture(scope="session")
def after_the_unit_tests():
    """Where the container tests run beside the host's (scripts/test.sh names a file in TEST_CONTAINERS_AFTER), the
    first container waits until the unit tests are done: they read the live machine's free memory. Images build
    meanwhile."""
    flag = os.environ.get("TEST_CONTAINERS_AFTER")
    deadline = time.monotonic() + 3600
    while flag and not Path(flag).exists():
        assert time.monotonic() < deadline, f"{flag} never appeared: the unit tests did not end within an hour"
        time.sleep(2)


@pytest.fixture(scope="session")
def host_report():
    """What the service's own detection says about this host (run in the project venv)."""
    res = subprocess.run(
        [sys.executable, "-m", "service", "detect", "--json"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def expected_backend(served: dict, host_report: dict) -> str:
    """The backend a container should run: the host's own detection picks it, unless the container's calibration
    (its first start times the model's layers) chose another, which its report then says."""
    calibrated = next((d for d in served["decisions"] if d["setting"] == "calibration.backend"), None)
    return calibrated["value"] if calibrated else host_report["backend"]["name"]


@pytest.fixture(scope="session")
def host_backend_without_zentorch():
    """The backend the service's own policy picks for this host's CPU in an image without zentorch."""
    import dataclasses

    from service.facts.hardware import read_hardware
    from service.facts.software import read_software
    from service.policy.machine.backend import choose_backend

    software = dataclasses.replace(
        read_software(), zentorch=None, zentorch_usable=False, zentorch_reason="zentorch is not installed"
    )
    return choose_backend(read_hardware().cpu, software).name
