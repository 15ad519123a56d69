"""Quantized models served end to end: the demo model quantized at test time (W8A8 and W4A16, compressed-tensors),
served by `python -m service serve`, asked through the official `openai` client; the kernel the running engine
logged is the one the policy names for the live backend; the outputs agree with the bf16 source. W4A16 is served
twice: with the policy's kernel (the service's ggml kernel where `make kernels` built it), and with auto-round-lib's
(SERVICE_INT4_KERNEL=auto-round)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from harness.quant_quality import QUALITY_TOKENS, greedy_with, prompt_ids, score
from harness.quantized_models import dequantized_state, quantized_demo
from service.facts.cpu import read_cpuinfo
from service.facts.model import inspect_model
from service.facts.software import read_software
from service.in_vllm.plugin import STATE_PREFIX
from service.kernels.registry import KERNELS
from service.models.demo_model import ensure_demo_model
from service.policy.linear.quant import plan_quant
from service.policy.machine.backends import BACKENDS
from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED
from service.settings import Settings
from service.startup import build_report
from service.startup.model_sources import choose_model
from tests.integration.conftest import _start
from tests.support.release import release
from tests.support.server import MODELS

SCHEMES = ("w8a8", "w4a16")
# Served variants: (scheme, the service settings it is started with).
# Each variant's server lives for the session (the tests below share it): three at once is what the build
# machines' memory holds beside the rest of the suite. vLLM's own int4 kernel, where it is not the policy's, is served
# by test_real_model_quality.py (one server at a time).
VARIANTS = {
    "w8a8": ("w8a8", {}),
    "w4a16": ("w4a16", {}),
    "w4a16-auto-round": ("w4a16", {"int4_kernel": "auto-round"}),
}


# The op each scheme's CPU kernel calls (vLLM's _C kernel builds; zentorch on Zen runs only where _C, which has
# both, is the build vLLM loads).
KERNEL_OPS = {"w8a8": "onednn_scaled_mm", "w4a16": "cpu_gemm_wna16"}
REFUSED = "refusing to start: "


@dataclass
class Refusal:
    scheme: str
    log: str


def _serve(name: str, server_logs):
    scheme, settings = VARIANTS[name]
    model = quantized_demo(MODELS, scheme)
    try:
        # A small KV cache: the demo model needs little, and the build machines are shared.
        server = _start(
            f"quantized/{name}",
            server_logs,
            f"demo-{scheme}",
            model=str(model),
            served_model_name=f"demo-{scheme}",
            kv_cache_gib="0.25",
            **settings,
        )
    except RuntimeError as exc:
        if f"exited with {EXIT_STARTUP_REFUSED}" in str(exc) and REFUSED in str(exc):
            return Refusal(scheme, (server_logs / f"quantized-{name}.log").read_text(errors="replace"))
        raise
    server.scheme, server.model, server.settings = scheme, model, settings
    return server


@pytest.fixture(scope="module")
def started(server_logs):
    """Per variant, the running server or the service's refusal; stopped at the end of the module."""
    servers: dict = {}

    def get(variant: str):
        if variant not in servers:
            servers[variant] = _serve(variant, server_logs)
        return servers[variant]

    yield get
    for server in servers.values():
        if not isinstance(server, Refusal):
            release(server.process)


@pytest.fixture(scope="session")
def live_kernel_ops() -> set[str]:
    """The ops of the vLLM kernel build this CPU loads, asked of vLLM itself in a fresh process."""
    probe = (
        "import torch; from vllm.platforms.cpu import CpuPlatform; CpuPlatform.import_kernels(); "
        f"print(' '.join(op for op in {sorted(KERNEL_OPS.values())!r} if hasattr(torch.ops._C, op)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    return set(out.stdout.split())


@pytest.fixture(params=list(VARIANTS))
def quantized_server(request, started):
    server = started(request.param)
    if isinstance(server, Refusal):
        pytest.skip(f"{request.param} is refused on this CPU (test_each_scheme_starts_where_a_kernel_runs_it)")
    return server


@pytest.mark.engine
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_scheme_starts_where_a_kernel_runs_it(variant, started, live_kernel_ops):
    """Served where vLLM's kernel build for this CPU has the scheme's op, or where the policy hands the model to the
    service's own kernel (installed, and running every layer); elsewhere refused before the engine loads, naming
    the missing op, instead of an engine that dies at its first forward pass."""
    server = started(variant)
    scheme, settings = VARIANTS[variant]
    ours = _services_kernel(quantized_demo(MODELS, scheme), settings)
    if ours:
        assert not isinstance(server, Refusal), server.log
        assert ours in server.process.log_tail(10**7)
    elif KERNEL_OPS[scheme] in live_kernel_ops:
        assert not isinstance(server, Refusal), server.log
    else:
        assert isinstance(server, Refusal), f"{variant} started without a kernel for it"
        assert KERNEL_OPS[scheme] in server.log.split(REFUSED, 1)[1] or "auto-round-lib" in server.log
        assert "Starting to load model" not in server.log


def _services_kernel(model: Path, settings: dict) -> str | None:
    """The service's kernel the policy hands to vLLM for this model on the live CPU, with what is installed here, as
    the line vLLM logs when it runs it; None for vLLM's own (or a refusal). The policy's own answer: whether a kernel
    takes the model hangs on its layer shapes too (ggml's need 32-wide blocks; the demo model's down_proj is 688 wide)."""
    chosen = Settings(model=str(model), cache_dir=MODELS, **settings)
    decided = build_report(chosen, model=choose_model(chosen, build_demo=False)).plan.find("quant.linear_kernel")
    if decided is None:
        return None
    ours = [KERNELS[k] for k in str(decided.value).split("+") if k in KERNELS and KERNELS[k].provider]
    return ours[0].log_markers[0] if ours else None


def _decisions(server) -> tuple[dict, dict]:
    report = httpx.get(f"{server.url}/v1/hardware", headers=server.headers(), timeout=30).json()
    return report, {d["setting"]: d for d in report["decisions"]}


@pytest.mark.engine
def test_chat_completion_answers(quantized_server):
    client = openai.OpenAI(base_url=f"{quantized_server.url}/v1", api_key="unused")
    answer = client.chat.completions.create(
        model=quantized_server.served_model, messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert answer.choices[0].message.content and answer.usage.completion_tokens > 0


@pytest.mark.engine
def test_the_engine_runs_the_kernel_the_policy_names_for_the_live_backend(quantized_server):
    report, decided = _decisions(quantized_server)
    backend = report["backend"]["name"]
    facts = inspect_model(str(quantized_server.model)).quant
    expected = plan_quant(
        facts,
        BACKENDS[backend],
        decided["engine.dtype"]["value"],
        Settings(**quantized_server.settings),
        {},
        auto_round_lib=read_software().auto_round_lib,
        ggml_kernel=read_software().ggml_kernel,
        vnni=read_cpuinfo().isa.vnni,
    )
    kernel = expected.find("quant.linear_kernel").value
    assert decided["quant.linear_kernel"]["value"] == kernel
    assert decided["quant.format"]["value"] == quantized_server.scheme

    log = quantized_server.process.log_tail(10**7)
    for name in kernel.split("+"):
        for marker in KERNELS[name].log_markers:
            assert marker in log, f"{backend}: policy says {name}, vLLM did not log {marker!r}"
    # The knobs the policy set reached the processes vLLM spawned (engine core and workers rename themselves with
    # setproctitle, which blanks their /proc environ; the other spawned helpers show what all of them inherited).
    knobs = {
        s.removeprefix("env."): d["value"]
        for s, d in decided.items()
        if s in ("env.VLLM_CPU_INT4_W4A8", "env.VLLM_DISABLED_KERNELS", "env.SERVICE_LINEAR_KERNELS")
    }
    envs = [_environ(pid) for pid in _spawned(quantized_server)]
    assert envs
    for name, value in knobs.items():
        assert all(env.get(name) == value for env in envs), (name, value)
    # The service's kernels were registered in every vLLM process (the plugin's state line of each).
    states = [json.loads(line.split(STATE_PREFIX, 1)[1]) for line in log.splitlines() if STATE_PREFIX in line]
    wanted = {k: "registered" for k in knobs.get("SERVICE_LINEAR_KERNELS", "").split(",") if k}
    assert any(s["process"] == "EngineCore" for s in states) and any(
        s["process"].startswith("VllmWorker") for s in states
    ), states
    assert all(s["linear_kernels"] == wanted for s in states), states


def _spawned(server) -> list[int]:
    group = subprocess.run(["pgrep", "-g", str(server.process.proc.pid)], capture_output=True, text=True).stdout
    pids = [int(p) for p in group.split() if int(p) != server.process.proc.pid]
    return [
        p
        for p in pids
        if Path(f"/proc/{p}/cmdline").exists() and not Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"VLLM::")
    ]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


@pytest.mark.engine
def test_outputs_agree_with_the_bf16_source(quantized_server):
    source = ensure_demo_model(MODELS)
    prompts = prompt_ids(source)
    client = openai.OpenAI(base_url=f"{quantized_server.url}/v1", api_key="unused")
    generated, logprobs = [], []
    for prompt in prompts:
        out = client.completions.create(
            model=quantized_server.served_model,
            prompt=prompt,
            max_tokens=QUALITY_TOKENS,
            temperature=0,
            logprobs=1,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
        )
        lp = out.choices[0].logprobs
        generated.append([int(t.removeprefix("token_id:")) for t in lp.tokens])
        logprobs.append(list(lp.token_logprobs))
    quality = score(source, prompts, generated, logprobs)
    assert quality.passes(quantized_server.scheme), quality


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quality_checks_fail_a_corrupted_scale_and_pass_the_exact_dequantization(scheme):
    """The thresholds separate a correct kernel (here: the exact dequantized weights) from a broken one (the same
    checkpoint with every o_proj scale x4), without an engine."""
    source = ensure_demo_model(MODELS)
    prompts = prompt_ids(source)
    exact = score(
        source,
        prompts,
        *greedy_with(source, dequantized_state(quantized_demo(MODELS, scheme)), prompts, QUALITY_TOKENS),
    )
    broken = score(
        source,
        prompts,
        *greedy_with(source, dequantized_state(quantized_demo(MODELS, scheme, 4.0)), prompts, QUALITY_TOKENS),
    )
    assert exact.passes(scheme), exact
    assert not broken.passes(scheme), broken
