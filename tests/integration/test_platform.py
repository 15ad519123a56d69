"""The backend decision is what vLLM runs, in every process it starts; the torch patch decision reaches them too.

Each vLLM process logs one state line from the service's general plugin (service/in_vllm/plugin.py): the platform
class vLLM resolved in that process, and what became of the torch patch there. The expectation for the live
machine comes from the raw facts vLLM's own Zen detection reads (vendor, AVX-512, zentorch), never a literal.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from service.facts.software import read_software
from service.in_vllm.contract import PLATFORM_ENV, WORKER_START_ENV
from service.in_vllm.fx_graph_cache_patch import PatchStatus
from service.policy.in_vllm.patches import needs_fxgraph_pickle_patch
from service.policy.machine.backends import GENERIC_PLATFORM, ZEN_PLATFORM
from tests.integration.conftest import _start
from tests.support import engines
from tests.support.live_cpu import expected_platform
from tests.support.server import MODELS, REPO, forked, process_states, service_env

pytestmark = pytest.mark.engine

ZEN5_FIXTURE = REPO / "tests" / "fixtures" / "cpuinfo" / "epyc_9755_zen5.txt"


def check_running_platform(server, platform: str) -> None:
    """The report, /v1/hardware, service_info, the startup log and every vLLM process name `platform`."""
    report = httpx.get(f"{server.url}/v1/hardware", headers=server.headers()).json()
    assert report["backend"]["platform"] == platform, report["backend"]
    decided = {d["setting"]: d["value"] for d in report["decisions"]}
    assert decided[f"env.{PLATFORM_ENV}"] == platform

    families = text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
    info = next(s for f in families for s in f.samples if s.name == "service_info")
    assert info.labels["platform"] == platform and info.labels["backend"] == report["backend"]["name"]

    log = server.process.log_path.read_text(errors="replace")
    assert f"vLLM platform {platform} for backend {report['backend']['name']}" in log
    states = process_states(log)
    names = {s["process"] for s in states}
    assert "EngineCore" in names and any(n.startswith("VllmWorker") for n in names), states
    assert len({s["pid"] for s in states}) == len(states), "one line per process"
    assert {(s["platform"], s["decided_platform"]) for s in states} == {(platform, platform)}, states
    engine_core = next(s for s in states if s["process"] == "EngineCore")
    assert engine_core["title"] == "VLLM::EngineCore"
    check_worker_start(states, decided[f"env.{WORKER_START_ENV}"])
    check_port_left_to_the_api_process(server, states)


def check_worker_start(states: list[dict], decided: str, by_the_service: bool = True) -> None:
    """vLLM's processes start as the plan decided: the engine core forked from the API process where the service's
    engine start ran (`by_the_service`; vLLM's offline LLM spawns it), each worker from its engine core; each forked or
    spawned process ran the plugin itself: its own line, watching the process that started it."""
    fork = decided == "fork"
    api = next(s for s in states if s["process"] == "MainProcess")
    engine_core = next(s for s in states if s["process"] == "EngineCore")
    workers = [s for s in states if s["process"].startswith("VllmWorker")]
    assert engine_core["workers_start"] == ("fork" if fork else "not asked"), states
    assert (api["forked"], engine_core["forked"]) == (False, fork and by_the_service), states
    assert workers and {w["forked"] for w in workers} == {fork}, states
    assert engine_core["watched_parent"] == api["pid"], states
    assert {w["watched_parent"] for w in workers} == {engine_core["pid"]}, states


def check_port_left_to_the_api_process(server, states: list[dict]) -> None:
    """A forked engine core and its workers hold none of the service's listening sockets, which the API process
    keeps: after its SIGKILL the port is free again for the restarted service. The engine core runs on the API
    process's CPUs, as a spawned one does, whatever the thread that forked it was bound to."""
    import psutil

    api = next(s for s in states if s["process"] == "MainProcess")
    engine_core = next(s for s in states if s["process"] == "EngineCore")
    cpus = [psutil.Process(s["pid"]).cpu_affinity() for s in (api, engine_core)]
    assert cpus[0] == cpus[1], cpus

    holders = set()
    for s in states:
        with contextlib.suppress(psutil.NoSuchProcess):
            for c in psutil.Process(s["pid"]).net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN and c.laddr.port == server.process.port:
                    holders.add(s["process"])
    assert holders == {"MainProcess"}, holders


def test_the_engine_runs_the_platform_the_report_chose(chat_server):
    check_running_platform(chat_server, expected_platform())


def test_every_vllm_process_applies_the_startup_patch_decision(chat_server):
    """No forcing here: the installed torch decides, once, and each process reports that decision."""
    states = process_states(chat_server.process.log_path.read_text(errors="replace"))
    needed = needs_fxgraph_pickle_patch(torch.__version__)
    statuses = {s["fxgraph_patch"] for s in states}
    if needed:  # vLLM's env_override patches at import; ours then finds its marks, or patches first
        # (a forked worker holds its engine core's patched torch)
        in_place = {PatchStatus.APPLIED, PatchStatus.PATCHED_BY_VLLM, PatchStatus.ALREADY_APPLIED}
        assert statuses <= {s.value for s in in_place}, states
    else:
        assert statuses == {PatchStatus.NOT_NEEDED.value}, states


def test_every_vllm_process_holds_the_amx_tile_state_where_the_cpu_shows_tiles(chat_server):
    """vLLM's bf16 attention runs on AMX tiles wherever torch sees them, and vLLM never asks Linux for the tile
    state: the plugin asks in each process (service/policy/in_vllm/amx_state.py), and says so."""
    states = process_states(chat_server.process.log_path.read_text(errors="replace"))
    expected = "granted" if torch.cpu._is_amx_tile_supported() else "not asked"
    assert states and {s["amx_tile_state"] for s in states} == {expected}, states


def test_avx512_on_a_zen_host_runs_vllms_generic_platform(server_logs):
    """The A/B switch away from zentorch. Live on a Zen host; elsewhere the recorded Zen 5 host's plan,
    through `detect --cpuinfo`, handed to vLLM's own platform resolution with the service's plugin."""
    if expected_platform() == ZEN_PLATFORM:
        server = _start("ab-avx512", server_logs, "demo-tiny-llama", backend="avx512")
        try:
            check_running_platform(server, GENERIC_PLATFORM)
        finally:
            server.process.stop()
            server.process.kill_group()
        return

    plans = {requested: _detect_env(requested) for requested in ("auto", "avx512")}
    assert plans["avx512"][PLATFORM_ENV] == GENERIC_PLATFORM
    resolved = _vllm_resolves(plans)
    # What vLLM resolves with the plan's environment is what the plan says, for both requests ...
    assert resolved == {requested: env[PLATFORM_ENV] for requested, env in plans.items()}
    # ... and the plugin, not vLLM's own detection, decided it: vLLM alone would run its generic platform
    # on this non-Zen host, while the plan for the recorded Zen host (zentorch usable here) says Zen.
    if read_software().zentorch_usable:
        assert resolved["auto"] == ZEN_PLATFORM


def _detect_env(backend: str) -> dict[str, str]:
    """The environment `serve` would set for the recorded Zen 5 host (as the startup hook's apply does)."""
    env = service_env(MODELS)
    out = subprocess.run(
        [sys.executable, "-m", "service", "detect", "--json", "--cpuinfo", str(ZEN5_FIXTURE), "--backend", backend],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    report = json.loads(out.stdout)
    assert out.returncode == 0, report["errors"]
    return {d["setting"][4:]: d["value"] for d in report["decisions"] if d["setting"].startswith("env.")}


def _vllm_resolves(plans: dict[str, dict[str, str]]) -> dict[str, str]:
    """vLLM's platform resolution (as each of its processes runs it) under each plan's environment."""
    script = textwrap.dedent(
        """
        import json, os, sys
        from vllm.platforms import resolve_current_platform_cls_qualname

        resolved = {}
        for requested, env in json.loads(sys.argv[1]).items():
            os.environ.update(env)
            resolved[requested] = resolve_current_platform_cls_qualname()
        print(json.dumps(resolved))
        """
    )
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}  # what the Makefile exports; the plans empty it
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(plans)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


FORCED_ENGINE = textwrap.dedent(
    """
    import os

    from service.models.demo_model import DEMO_NAME
    from service.in_vllm.contract import FXGRAPH_PATCH_ENV
    from service.settings import load_settings
    from service.startup import apply, build_report
    from service.startup.model_sources import choose_model

    if __name__ == "__main__":  # vLLM spawns its engine core and workers
        settings = load_settings(model=DEMO_NAME)
        choice = choose_model(settings, build_demo=True)
        model = choice.location
        report = build_report(settings, model=choice)
        apply(report)
        os.environ[FXGRAPH_PATCH_ENV] = "1"  # force the version gate: the decision startup makes on torch 2.10
        from vllm import LLM, EngineArgs

        # The plan's engine arguments that are EngineArgs fields (it also holds the API server's own).
        args = {k: v for k, v in report.plan.engine_args.items() if k in EngineArgs.__dataclass_fields__}
        LLM(model=model, **args)
        print("engine started")
    """
)


def test_a_forced_patch_is_applied_in_every_process_vllm_starts(tmp_path):
    """One offline engine: the startup hook's environment with the patch decision forced on; every vLLM
    process (this one, the engine core, the worker) reports the patch applied by the service's plugin."""
    script = tmp_path / "forced_engine.py"
    script.write_text(FORCED_ENGINE)
    # A small KV cache: this engine only has to start, on a machine other test servers share.
    env = service_env(MODELS, kv_cache_gib="0.25", max_model_len="256")
    engines.started("forced-patch")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    log = out.stdout + out.stderr
    assert out.returncode == 0 and "engine started" in out.stdout, log[-5000:]
    states = process_states(log)
    names = {s["process"] for s in states}
    assert {"MainProcess", "EngineCore"} <= names and any(n.startswith("VllmWorker") for n in names), states
    # On torch 2.10 itself vLLM's env_override wraps dumps at import, before the plugin runs: one wrapper.
    expected = PatchStatus.PATCHED_BY_VLLM if needs_fxgraph_pickle_patch(torch.__version__) else PatchStatus.APPLIED
    # A forked worker holds the engine core's patched torch, and its plugin finds the patch in place.
    in_place = PatchStatus.ALREADY_APPLIED if expected is PatchStatus.APPLIED else expected
    for s in states:
        assert s["fxgraph_patch"] == (in_place if forked(s) else expected).value, states
    check_worker_start(states, "fork", by_the_service=False)  # vLLM's offline engine spawns its engine core
    assert {s["platform"] for s in states} == {expected_platform()}, states
