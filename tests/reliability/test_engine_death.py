"""Engine death: kill the engine core process; /health turns 503 and the service exits non-zero, so the
container's restart policy (compose: restart: unless-stopped) brings it back. Server death: kill the API server
with SIGKILL; the engine's processes end too, instead of holding the memory a restart needs."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import psutil
import pytest

from harness import ServerProcess
from service.server.supervision.engine_probe import PROBE_INTERVAL_S
from service.server.supervision.watchdog import WATCHDOG_INTERVAL_S
from tests.reliability.conftest import SERVED, start_server
from tests.support.server import MODELS, service_env, watch_until_exit

pytestmark = pytest.mark.engine

HEALTH_DEADLINE_S = 5.0
EXIT_DEADLINE_S = 15.0
EXIT_ENGINE_DIED = 3


def engine_core(pid: int) -> psutil.Process:
    for child in psutil.Process(pid).children(recursive=True):
        if "EngineCore" in child.name() or any("EngineCore" in part for part in child.cmdline()[:1]):
            return child
    raise AssertionError(f"no EngineCore process under {pid}")


def test_killing_the_engine_core_fails_health_and_exits_non_zero(reliability_logs):
    server = start_server("engine-death/core", reliability_logs / "engine-death.log", max_model_len="1024")
    try:
        core = engine_core(server.pid)
        # A request in flight when the engine dies must get an answer, not hang.
        client, outcome = _stream_in_flight(server.url)
        time.sleep(0.5)
        assert httpx.get(f"{server.url}/health").status_code == 200

        killed_at = time.monotonic()
        core.send_signal(signal.SIGKILL)
        exit_ = watch_until_exit(server.process, killed_at, EXIT_DEADLINE_S + 5)
        health_503_after, code, exited_after = exit_.health_503_after, exit_.code, exit_.after
        client.join(10)
        print(
            f"engine death: /health 503 after {health_503_after:.2f}s, exit {code} after {exited_after:.1f}s; "
            f"in-flight request: {outcome.get('status')}, {outcome.get('ended')}, "
            f"ended with {outcome.get('events', [])[-2:]}"
        )
        assert health_503_after is not None and health_503_after <= HEALTH_DEADLINE_S
        assert code == EXIT_ENGINE_DIED
        assert exited_after <= EXIT_DEADLINE_S
        assert "ended" in outcome and outcome["at"] - killed_at <= EXIT_DEADLINE_S, outcome
        # It ends with an error event that says how the engine died and that a retry will do, then [DONE].
        *_, error, done = outcome["events"]
        assert done == "[DONE]", outcome
        error = json.loads(error)["error"]
        assert error["code"] == 503 and "engine died: the engine core was killed by SIGKILL" in error["message"]
        assert "retry this request" in error["message"], error
        assert "engine is dead (engine died: the engine core was killed by SIGKILL" in server.log()
        # Nothing of it is left running: no orphaned worker holding the cores.
        assert not _engine_processes_left(server.pid)
    finally:
        server.process.kill_group()


def test_an_engine_that_dies_during_the_drain_makes_the_stop_exit_non_zero(reliability_logs):
    """A SIGTERM, then the engine core dies with a request in flight: that request is answered with an error, and
    the exit says the engine died (was 0: the drain ended once the request was answered, before the watchdog
    looked)."""
    server = start_server("engine-death/draining", reliability_logs / "engine-death-draining.log", max_model_len="1024")
    try:
        core = engine_core(server.pid)
        client, outcome = _stream_in_flight(server.url)
        time.sleep(0.5)
        server.process.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while "draining" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "received SIGTERM: draining (1 request(s) in flight" in server.log()
        killed_at = time.monotonic()
        core.send_signal(signal.SIGKILL)
        exit_ = watch_until_exit(server.process, killed_at, EXIT_DEADLINE_S + 5)
        client.join(10)
        last = outcome.get("events", [])[-2:]
        print(f"engine death while draining: exit {exit_.code} after {exit_.after:.1f}s; in-flight ended with {last}")
        assert exit_.code == EXIT_ENGINE_DIED and exit_.after <= EXIT_DEADLINE_S, server.log()[-3000:]
        assert "ended" in outcome and outcome["at"] - killed_at <= EXIT_DEADLINE_S, outcome
        assert "engine is dead (it died while the service stopped)" in server.log()
        assert not _engine_processes_left(server.pid)
    finally:
        server.process.kill_group()


STALL_S = 3.0


def test_a_hung_engine_core_fails_health_answers_its_requests_and_exits_non_zero(reliability_logs):
    """An engine core that stops answering (SIGSTOP stands for a kernel stuck or a deadlock) stayed alive to vLLM's
    health check: /health 200, every request waiting for ever. Busy, it answers the probe between steps."""
    server = start_server(
        "engine-death/hang",
        reliability_logs / "engine-hang.log",
        max_model_len="1024",
        engine_stall_seconds=f"{STALL_S:g}",
    )
    try:
        core = engine_core(server.pid)
        busy = threading.Event()
        feeder = threading.Thread(target=_keep_busy, args=(server.url, busy), daemon=True)
        feeder.start()
        busy_until = time.monotonic() + STALL_S + PROBE_INTERVAL_S + 1
        while time.monotonic() < busy_until:
            assert httpx.get(f"{server.url}/health").status_code == 200, server.log()[-2000:]
            time.sleep(0.25)
        busy.set()
        feeder.join(30)

        answers: dict[str, object] = {}
        stream = threading.Thread(target=_last_stream_events, args=(server.url, answers), daemon=True)
        plain = threading.Thread(target=_plain_answer, args=(server.url, answers), daemon=True)
        stream.start()
        plain.start()
        time.sleep(1.0)
        stopped_at = time.monotonic()
        core.send_signal(signal.SIGSTOP)
        exit_ = watch_until_exit(server.process, stopped_at, STALL_S + PROBE_INTERVAL_S + 30)
        stream.join(10)
        plain.join(10)
        print(f"engine hang: /health 503 after {exit_.health_503_after}s, exit {exit_.code} after {exit_.after:.1f}s")
        assert exit_.health_503_after is not None and exit_.health_503_after <= STALL_S + PROBE_INTERVAL_S + 3
        assert exit_.code == EXIT_ENGINE_DIED, server.log()[-3000:]
        assert "engine is dead (engine core hung: it has answered no probe for" in server.log()
        # Each request in flight got its answer, not a cut connection.
        assert answers["plain"] == 503 and "engine core hung" in str(answers["plain_body"]), answers
        assert answers["stream"][-1] == "[DONE]" and "engine core hung" in answers["stream"][-2], answers
        assert not _engine_processes_left(server.pid)
    finally:
        server.process.kill_group()


def test_a_worker_killed_as_the_engine_comes_up_ends_the_start_with_exit_3(reliability_logs):
    """The worker dies just as its engine core reports ready (the OOM killer's moment: the KV cache is allocated):
    the engine core dies a moment after its handshake, while the service asks it for its tasks. That call waited
    for ever (vLLM fails only the calls made after a death): "starting", with nothing left to wait for."""
    log_path = reliability_logs / "worker-killed-starting.log"
    process = ServerProcess(
        service_env(MODELS, max_model_len="1024"), log_path, name="engine-death/worker-killed-starting"
    ).start()
    try:
        deadline = time.monotonic() + 300
        while "init engine (profile, create kv cache, warmup model) took" not in log_path.read_text():
            assert process.proc.poll() is None and time.monotonic() < deadline, process.log_tail()
            time.sleep(0.02)
        worker = _named(process.pid, "VLLM::Worker")
        assert worker is not None, process.log_tail()
        killed_at = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        exit_ = watch_until_exit(process, killed_at, EXIT_DEADLINE_S + 5)
        log = log_path.read_text()
        print(f"worker killed while starting: exit {exit_.code} after {exit_.after:.1f}s")
        assert exit_.code == EXIT_ENGINE_DIED and exit_.after <= EXIT_DEADLINE_S, log[-3000:]
        # The cause names the worker that ended, and no other: the start watch saw it before vLLM's start returned.
        cause = next(line for line in log.splitlines() if "ERROR service: engine failed to start: " in line)
        assert f"an engine worker process (pid {worker.pid}) ended" in cause, cause
        assert cause.count("an engine worker process") == 1, cause
        assert "ready: serving" not in log
        assert not _engine_processes_left(process.pid)
    finally:
        process.kill_group()


START_STALL_S = 8.0


def test_a_start_that_hangs_fails_health_and_exits_non_zero(reliability_logs):
    """An engine stopped while it loads (SIGSTOP stands for a deadlock or a lock never released): vLLM waits
    for its handshake with no limit, and the service said "starting" for ever. A normal start under the same short
    limit is not mistaken for one: the demo model's start makes progress every second."""
    log_path = reliability_logs / "start-hang.log"
    env = service_env(MODELS, max_model_len="1024", engine_stall_seconds=f"{START_STALL_S:g}")
    process = ServerProcess(env, log_path, name="engine-death/start-hang").start()
    try:
        deadline = time.monotonic() + 300
        while (core := _named(process.pid, "VLLM::EngineCore")) is None:
            assert process.proc.poll() is None and time.monotonic() < deadline, process.log_tail()
            time.sleep(0.1)
        assert httpx.get(f"{process.url}/health").status_code == 200, process.log_tail()
        stopped_at = time.monotonic()
        core.send_signal(signal.SIGSTOP)
        # And its worker, once it has spawned one: a deadlock stops the whole engine. A worker left running went on
        # loading for 10-14 s here, and for over 30 s on a busy host, before the window without progress began.
        for worker in core.children(recursive=True):
            worker.send_signal(signal.SIGSTOP)
        exit_ = watch_until_exit(process, stopped_at, START_STALL_S + 30)
        log = log_path.read_text()
        print(f"start hang: /health 503 after {exit_.health_503_after}s, exit {exit_.code} after {exit_.after:.1f}s")
        assert exit_.code == EXIT_ENGINE_DIED, log[-3000:]
        # Not before a whole window without progress, and within a few ticks after it. The window opens at the last
        # sample taken before the stop, up to one tick earlier (7.6 s after the stop was seen, with an 8 s window).
        window_from = START_STALL_S - WATCHDOG_INTERVAL_S
        assert exit_.health_503_after is not None and window_from <= exit_.health_503_after <= START_STALL_S + 15
        assert f"engine is dead (engine start hung: in {START_STALL_S:.0f} s" in log, log[-3000:]
        assert f"VLLM::EngineCore (pid {core.pid}) stopped" in log, log[-3000:]
        assert "ready: serving" not in log
        # Nothing of its process group runs on: the stopped engine core was killed, not left stopped.
        left = [p for p in psutil.process_iter(["status"]) if _in_group(p, process.pid) and p.pid != process.pid]
        assert [p for p in left if p.info["status"] != psutil.STATUS_ZOMBIE] == [], left
    finally:
        process.kill_group()


def _named(pid: int, name: str) -> psutil.Process | None:
    try:
        return next((p for p in psutil.Process(pid).children(recursive=True) if p.name() == name), None)
    except psutil.Error:
        return None


def _keep_busy(url: str, done: threading.Event) -> None:
    body = {"model": SERVED, "prompt": "hello", "max_tokens": 64, "ignore_eos": True}
    while not done.is_set():
        httpx.post(f"{url}/v1/completions", json=body, timeout=30).raise_for_status()


def _last_stream_events(url: str, answers: dict[str, object]) -> None:
    body = {"model": SERVED, "prompt": "hello", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        answers["stream"] = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]


def _plain_answer(url: str, answers: dict[str, object]) -> None:
    body = {"model": SERVED, "prompt": "hello", "max_tokens": 1000, "ignore_eos": True}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    answers["plain"], answers["plain_body"] = resp.status_code, resp.text


def _stream_in_flight(url: str) -> tuple[threading.Thread, dict[str, object]]:
    """A long streamed completion in a thread; its outcome (status, how it ended, when) fills the dict."""
    outcome: dict[str, object] = {}

    def in_flight():
        body = {"model": SERVED, "prompt": "hello", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as resp:
                outcome["status"] = resp.status_code
                outcome["events"] = [line.removeprefix("data: ") for line in resp.iter_lines() if line]
            outcome["ended"] = "closed"
        except httpx.HTTPError as exc:
            outcome["ended"] = type(exc).__name__
        outcome["at"] = time.monotonic()

    client = threading.Thread(target=in_flight, daemon=True)
    client.start()
    return client, outcome


def _engine_processes_left(pgid: int) -> list[psutil.Process]:
    """vLLM processes of the server's group still running. A worker that has exited but that init has not reaped
    yet (a zombie: no memory, no CPU) is not running."""
    return [
        p
        for p in psutil.process_iter(["name", "status"])
        if p.info["name"]
        and "VLLM::" in p.info["name"]
        and p.info["status"] != psutil.STATUS_ZOMBIE
        and _in_group(p, pgid)
    ]


def test_killing_the_api_server_ends_the_engine_processes(reliability_logs):
    server = start_server("engine-death/server", reliability_logs / "server-death.log", max_model_len="1024")
    try:
        engine = [p for p in psutil.Process(server.pid).children(recursive=True) if p.name().startswith("VLLM::")]
        assert {p.name() for p in engine} >= {"VLLM::EngineCore", "VLLM::Worker"}, engine
        killed_at = time.monotonic()
        server.process.proc.send_signal(signal.SIGKILL)  # the OOM killer's way: no handler of the service runs
        server.process.proc.wait(10)
        _, alive = psutil.wait_procs(engine, timeout=EXIT_DEADLINE_S)
        left = [p for p in alive if _running(p)]
        print(f"server death: {len(engine)} engine processes ended {time.monotonic() - killed_at:.1f}s after SIGKILL")
        assert not left, f"still running {EXIT_DEADLINE_S}s after the API server's SIGKILL: {left}"
        assert "watched_parent" in server.log()
    finally:
        server.process.kill_group()


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _in_group(proc: psutil.Process, pgid: int) -> bool:
    try:
        import os

        return os.getpgid(proc.pid) == pgid
    except (ProcessLookupError, psutil.Error):
        return False
