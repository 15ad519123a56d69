"""Claude Code and Codex CLI, from npm at the versions mk/agents.mk pins, run unmodified against the service: each with
nothing set but the service's address, its key and a model name (telemetry off: there is no network here), and through
`python -m service launch`, which sets those itself.

Two servers. A tiny Qwen3-style model whose template renders the clients' tools and whose context holds their prompts,
but not Claude Code's 32,000-token output budget beside them (tests/support/tiny_models.py `tiny_qwen3_agent`: it
thinks, then answers with a scripted text), served with a key and `SERVICE_MODEL_ALIASES=claude-*`: every protocol
path, to the clients' final answers. And the default model as `make serve` runs it (the package's `default_server`: a
template that renders no tools, 8192 tokens of context). Neither client sends a temperature: the policy's default for
that model is greedy (service/policy/engine/sampling.py), without which SmolLM2-135M mostly wrote on to the end of its
context and Claude Code's next request no longer fit ("Prompt is too long").

Each run passes through a recording proxy (tests/support/recording_proxy.py): the requests of each turn and each one's
prompt tokens are printed at the end of the module; the service's own /metrics must count each of those requests
answered 2xx, and the prompt tokens they add up to. The Claude Code session of turn 1 and `--continue` is written, as
it reached the service, into .cache/agent-sessions/ (harness/agent_session.py): the session the bench replays."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import agent_session
from tests.integration.conftest import RunningServer, _start
from tests.support import agent_clients
from tests.support.agent_clients import ClaudeRun, CodexRun, Scratch, claude_argv, claude_env, codex_config
from tests.support.engines import started
from tests.support.recording_proxy import Exchange, RecordingProxy
from tests.support.release import release
from tests.support.server import MODELS, start_table
from tests.support.tiny_models import AGENT_ANSWER, tiny_qwen3_agent

AGENT = "tiny-qwen3-agent"
AGENT_KEY = "agent-clients-key-5f1e0c9a7b"
PROMPT = "What is the capital of France?"


@dataclass
class Clients:
    claude: Path
    codex: Path
    versions: dict[str, str]


@pytest.fixture(scope="module")
def clients() -> Clients:
    if shutil.which("npm") is None:
        pytest.skip("npm and node are missing: `make test` installs them (mk/agents.mk)")
    found = agent_clients.install()
    versions = {name: agent_clients.version(path) for name, path in found.items()}
    return Clients(found["claude"], found["codex"], versions)


@pytest.fixture(scope="module")
def agent_server(server_logs):
    server = _start(
        "agent-clients",
        server_logs,
        AGENT,
        api_key=AGENT_KEY,
        model=str(tiny_qwen3_agent(MODELS)),
        served_model_name=AGENT,
        kv_cache_gib="0.25",
        model_aliases="claude-*",
    )
    yield server
    release(server.process)


@pytest.fixture(scope="module")
def agent_table(server_logs):
    """A model table of two engines of the agent model: Claude Code's small fast model (its claude-*haiku* names)
    and its main one (any other claude-* name), listed in that order since aliases are matched in the table's."""
    model = str(tiny_qwen3_agent(MODELS))
    models = [
        {"source": model, "name": "agent-small", "aliases": ["claude-*haiku*"]},
        {"source": model, "name": "agent-main", "aliases": ["claude-*"], "pinned": True},
    ]
    process = start_table(
        server_logs / "agent-table.log",
        name="model-table/agents",
        models=models,
        api_key=AGENT_KEY,
        kv_cache_gib="0.25",
    )
    yield RunningServer(process, "agent-main", AGENT_KEY)
    release(process)


SUMMARY: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    """The requests of every turn and their prompt tokens, printed once the module's tests are done (past pytest's
    capture, so that `make test`'s log has them)."""
    yield
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print()
        for line in SUMMARY:
            print(f"agent clients: {line}")


def service_counts(server: RunningServer) -> Counter[str]:
    """The service's own counts: requests by method, handler and status class, and prompt tokens."""
    text = httpx.get(f"{server.url}/metrics", headers=server.headers(), timeout=10).text
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "http_requests_total":
                counts[f"{sample.labels['method']} {sample.labels['handler']} {sample.labels['status']}"] += (
                    sample.value
                )
            elif sample.name == "vllm:prompt_tokens_total":
                counts["prompt tokens"] += sample.value
    return counts


@dataclass
class Turn:
    exchanges: list[Exchange] = field(default_factory=list)
    service: Counter[str] = field(default_factory=Counter)  # what /metrics counted meanwhile

    @property
    def posts(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST"]

    def line(self, what: str) -> str:
        asked = "; ".join(f"{e.path} {e.model} -> {e.status}, {e.prompt_tokens} prompt tokens" for e in self.posts)
        return f"{what}: {len(self.posts)} request(s): {asked}"


@contextmanager
def turn(server: RunningServer, proxy: RecordingProxy) -> Iterator[Turn]:
    """What the service was asked during the block, through the proxy and by its own count."""
    seen, before, first = Turn(), service_counts(server), len(proxy.exchanges)
    yield seen
    # The proxy records an exchange, and the service counts it, as its answer ends: the client may be gone by then.
    deadline = time.monotonic() + 10
    while True:
        seen.exchanges, seen.service = proxy.exchanges[first:], service_counts(server) - before
        counted = sum(n for key, n in seen.service.items() if key.startswith("POST "))
        if (proxy.in_flight == 0 and counted == len(seen.posts)) or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def assert_served(seen: Turn, why: str) -> None:
    """Every request of the turn answered 200, as the client saw it and as the service counted it."""
    assert seen.posts, f"the client asked nothing: {why}"
    assert all(e.status == 200 for e in seen.exchanges), f"{seen.line('requests')}\n{why}"
    counted = {key: n for key, n in seen.service.items() if key.startswith("POST ")}
    assert set(counted) <= {"POST /v1/messages 2xx", "POST /v1/responses 2xx"}, (counted, why)
    assert sum(counted.values()) == len(seen.posts), (counted, seen.line("requests"))
    assert seen.service["prompt tokens"] == sum(e.prompt_tokens or 0 for e in seen.posts), (seen.service, why)


def claude_succeeded(run: ClaudeRun, versions: dict[str, str]) -> str:
    why = f"{versions['claude']}: {run.summary()}"
    assert run.finished.returncode == 0 and run.result is not None, why
    assert run.result["is_error"] is False and run.result["result"].strip(), why
    return run.result["result"]


def codex_succeeded(run: CodexRun, versions: dict[str, str]) -> str:
    why = f"{versions['codex']}: {run.summary()}"
    assert run.finished.returncode == 0 and not run.failures and run.messages, why
    return run.messages[-1]


def launch_claude(clients: Clients, where: Scratch, port: int, key: str | None, timeout: float) -> ClaudeRun:
    """`python -m service launch claude -- -p PROMPT --output-format json`, the service's settings in its environment:
    the port (the proxy's, so that its requests are seen) and the key."""
    settings = {"SERVICE_PORT": str(port)} | ({"SERVICE_API_KEY": key} if key else {})
    argv = [sys.executable, "-m", "service", "launch", "claude", "--client-path", str(clients.claude), "--"]
    argv += claude_argv(clients.claude, PROMPT)[1:]
    return ClaudeRun(agent_clients.run(argv, where, settings | agent_clients.QUIET, timeout))


# ---------------------------------------------------------------------------------------------------------
# The tiny Qwen3-style model: tools rendered, the clients' whole prompts in its context
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_claude_code_answers_and_continues_on_a_model_that_renders_its_tools(clients, agent_server):
    with RecordingProxy(agent_server.url) as proxy, agent_clients.scratch() as where:
        for resume in (False, True):
            env = claude_env(proxy.url, AGENT_KEY, AGENT)
            with turn(agent_server, proxy) as seen:
                run = ClaudeRun(agent_clients.run(claude_argv(clients.claude, PROMPT, resume=resume), where, env))
            SUMMARY.append(
                seen.line(f"{clients.versions['claude']} on {AGENT}, {'--continue' if resume else 'turn 1'}")
            )
            assert claude_succeeded(run, clients.versions) == AGENT_ANSWER  # the model's own words, through Claude Code
            assert_served(seen, run.summary())
        posts = [e for e in proxy.exchanges if e.method == "POST"]
    # The session as it reached the service, for the bench's replay against both servers (harness/agent_session.py).
    requests = tuple({"path": e.path, "body": json.loads(e.body)} for e in posts)
    assert [r["path"] for r in requests] == ["/v1/messages"] * len(requests), [r["path"] for r in requests]
    agent_session.save(agent_session.Session("claude-code", clients.versions["claude"].split()[0], requests))


@pytest.mark.engine
def test_codex_answers_on_a_model_that_renders_its_tools(clients, agent_server):
    with RecordingProxy(agent_server.url) as proxy, agent_clients.scratch() as where:
        with turn(agent_server, proxy) as seen:
            run = agent_clients.run_codex(clients.codex, where, codex_config(proxy.url, AGENT), AGENT_KEY, PROMPT)
    SUMMARY.append(seen.line(f"{clients.versions['codex']} on {AGENT}"))
    assert codex_succeeded(run, clients.versions) == AGENT_ANSWER
    assert_served(seen, run.summary())


@pytest.mark.engine
def test_claude_code_naming_its_own_models_is_served_through_the_aliases(clients, agent_server):
    """No ANTHROPIC_MODEL: Claude Code asks for its own models by name, which claude-* maps to the served model."""
    with RecordingProxy(agent_server.url) as proxy, agent_clients.scratch() as where:
        with turn(agent_server, proxy) as seen:
            env = claude_env(proxy.url, AGENT_KEY, None)
            run = ClaudeRun(agent_clients.run(claude_argv(clients.claude, PROMPT), where, env))
    SUMMARY.append(seen.line(f"{clients.versions['claude']} on {AGENT}, no model named"))
    assert claude_succeeded(run, clients.versions) == AGENT_ANSWER
    assert_served(seen, run.summary())
    asked = {e.model for e in seen.posts}
    assert asked and all(m and m.startswith("claude-") for m in asked), asked


@pytest.mark.engine
def test_launch_gives_claude_code_the_services_key_and_model(clients, agent_server):
    with RecordingProxy(agent_server.url) as proxy, agent_clients.scratch() as where:
        with turn(agent_server, proxy) as seen:
            run = launch_claude(clients, where, proxy.port, AGENT_KEY, agent_clients.RUN_TIMEOUT_S)
    SUMMARY.append(seen.line(f"{clients.versions['claude']} on {AGENT}, by `python -m service launch`"))
    assert claude_succeeded(run, clients.versions) == AGENT_ANSWER
    assert_served(seen, run.summary())
    said = run.finished.stderr
    assert f"ANTHROPIC_MODEL={AGENT}" in said and "ANTHROPIC_AUTH_TOKEN=age...a7b" in said and AGENT_KEY not in said
    assert {e.model for e in seen.posts} == {AGENT}


# ---------------------------------------------------------------------------------------------------------
# The default model, as `make serve` runs it
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_launch_runs_claude_code_on_the_default_model(clients, default_server):
    with RecordingProxy(default_server.url) as proxy, agent_clients.scratch() as where:
        with turn(default_server, proxy) as seen:
            run = launch_claude(clients, where, proxy.port, None, agent_clients.RUN_TIMEOUT_S)
    SUMMARY.append(seen.line(f"{clients.versions['claude']} on the default model, by `python -m service launch`"))
    claude_succeeded(run, clients.versions)
    assert f"ANTHROPIC_MODEL={default_server.served_model}" in run.finished.stderr, run.summary()
    assert {e.model for e in seen.posts} == {default_server.served_model}
    assert_served(seen, run.summary())


@pytest.mark.engine
def test_codex_runs_on_the_default_model(clients, default_server):
    model = default_server.served_model
    with RecordingProxy(default_server.url) as proxy, agent_clients.scratch() as where:
        with turn(default_server, proxy) as seen:
            run = agent_clients.run_codex(clients.codex, where, codex_config(proxy.url, model), "unused", PROMPT)
    SUMMARY.append(seen.line(f"{clients.versions['codex']} on the default model"))
    codex_succeeded(run, clients.versions)
    assert_served(seen, run.summary())


# ---------------------------------------------------------------------------------------------------------
# Several models in one service: Claude Code's main and small fast names on two engines
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_claude_codes_main_and_small_fast_models_are_two_engines_of_one_table(clients, agent_table):
    def loads() -> dict[str, float]:
        text = httpx.get(f"{agent_table.url}/metrics", timeout=10).text
        return {
            s.labels["model"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "service_model_loads_total"
        }

    asked = {}
    with RecordingProxy(agent_table.url) as proxy, agent_clients.scratch() as where:
        for model in (None, "haiku"):  # its own main model's name, then its small fast one's (`--model haiku`)
            if model == "haiku":
                started("model-table/agent-small")
            first = len(proxy.exchanges)
            argv = claude_argv(clients.claude, PROMPT)
            argv = argv if model is None else [argv[0], "--model", model, *argv[1:]]
            run = ClaudeRun(agent_clients.run(argv, where, claude_env(proxy.url, AGENT_KEY, None)))
            assert claude_succeeded(run, clients.versions) == AGENT_ANSWER
            asked[model] = {e.model for e in proxy.exchanges[first:] if e.method == "POST"}
            assert all(e.status == 200 for e in proxy.exchanges[first:]), run.summary()
    SUMMARY.append(f"{clients.versions['claude']} on a two-model table: asked {asked}")
    assert all(m.startswith("claude-") and "haiku" not in m for m in asked[None]), asked
    assert asked["haiku"] and all("haiku" in m for m in asked["haiku"]), asked
    assert loads() == {"agent-main": 1.0, "agent-small": 1.0}  # each name went to its own engine
